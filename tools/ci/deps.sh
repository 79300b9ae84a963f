#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem builds, tests and benchmarks with. Idempotent: packages
# already present are left alone, and apt is not touched at all when nothing is missing.
set -euo pipefail
packages=(build-essential cmake pkg-config ccache catch2 libopenblas-dev libopenmpi-dev openmpi-bin
          libdnnl-dev ocl-icd-opencl-dev  # oneDNN: bf16 GEMMs on AVX512_BF16 CPUs (core/detail/onednn.cpp); its CMake package needs OpenCL
          libopenblas0-openmp  # OpenBLAS on GNU OpenMP: one thread pool with our kernels (core/parallel.cpp)
          nlohmann-json3-dev libfmt-dev libcli11-dev python3 zlib1g-dev
          dataset-fashion-mnist  # /usr/share/datasets/fashion-mnist: data::FashionMNIST and its test
          fortunes  # /usr/share/games/fortunes: data::TextDataset's default corpus and its test
          clang-14 libfuzzer-14-dev  # tools/ci/sanitize.sh fuzz: the libFuzzer targets of tools/fuzz/
          python3-torch   # PyTorch 1.13 (CPU) for tests/parity/test_parity.cpp, run with /usr/bin/python3
          python3-matplotlib)  # tools/train/plot.py
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# A small test helper from PyPI: Python's safetensors, to prove our files interoperate. Optional:
# the interop test says SKIP without it.
if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  python3 -m pip install -q safetensors numpy 2>/dev/null || echo "deps: could not pip install safetensors (interop test will skip)"
fi
