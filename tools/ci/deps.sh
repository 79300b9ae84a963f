#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem needs. Idempotent: packages already present are left
# alone, and apt is not touched at all when nothing is missing.
#
#   deps.sh train   what building the library and running `train` need (tools/train.sh)
#   deps.sh test    that, and what the tests, the fuzzers, the plots and the benchmark peers need
#                   (tools/test.sh; the default)
set -euo pipefail
set_name=${1:-test}
# Building and running train (configured without the tests): the compiler and CMake, MPI, OpenBLAS,
# oneDNN, the JSON, fmt and CLI11 headers, zlib, and the two data sets.
train=(build-essential cmake pkg-config libopenblas-dev libopenmpi-dev openmpi-bin
       libdnnl-dev ocl-icd-opencl-dev  # oneDNN: bf16 and f32 GEMMs, convolution (core/detail/onednn.cpp); its CMake package needs OpenCL
       libopenblas0-openmp  # OpenBLAS on GNU OpenMP: one thread pool with our kernels (core/parallel.cpp)
       nlohmann-json3-dev libfmt-dev libcli11-dev zlib1g-dev
       dataset-fashion-mnist  # /usr/share/datasets/fashion-mnist: train's default data, data::FashionMNIST
       fortunes)  # /usr/share/games/fortunes: train --model gpt's default corpus, data::TextDataset
# The tests and the tools around them.
test=(catch2 ccache python3
      clang-14 libfuzzer-14-dev  # tools/ci/sanitize.sh: the sanitizer builds and the libFuzzer targets of tools/fuzz/
      python3-torch   # PyTorch 1.13 (CPU): the parity tests' reference and the benchmarks' default peer, with /usr/bin/python3
      python3-matplotlib)  # tools/train/plot.py
case $set_name in
  train) packages=("${train[@]}") ;;
  test) packages=("${train[@]}" "${test[@]}") ;;
  *) echo "usage: deps.sh [train|test]" >&2; exit 2 ;;
esac
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
[ "$set_name" = test ] || exit 0
# A small test helper from PyPI: Python's safetensors, to prove our files interoperate. Optional:
# the interop test says SKIP without it.
if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  python3 -m pip install -q safetensors numpy 2>/dev/null || echo "deps: could not pip install safetensors (interop test will skip)"
fi
