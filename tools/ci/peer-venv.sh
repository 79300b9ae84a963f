#!/usr/bin/env bash
# Today's PyTorch as the benchmarks' peer: a virtual environment with PyTorch 2.x from PyPI (the
# CPU build of Linux's default wheel: MKL, oneDNN 3, a fused CPU scaled_dot_product_attention),
# beside Debian's python3-torch 1.13, which the parity tests keep as their reference.
#
#   tools/ci/peer-venv.sh [DIR]        (default DIR: $TANDEM_PEER_VENV, else <repo>/.peer-venv)
#   build/tools/bench_cpu --peer-python DIR/bin/python     (or TANDEM_PEER_PYTHON=DIR/bin/python)
#
# Opt-in, never part of .ci/run: PyPI's Linux wheel brings its CUDA libraries along (about 5 GB
# installed, a few minutes to fetch); only its CPU code runs here. Idempotent: an environment that
# already imports torch 2.x is left alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${1:-${TANDEM_PEER_VENV:-$root/.peer-venv}}
python=${PYTHON:-python3}
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c 'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 else 1)' 2>/dev/null; then
  echo "peer-venv: $venv already has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
else
  # Debian's python3 needs python3-venv for `-m venv`.
  if ! "$python" -m venv --help >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv
  fi
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch>=2" numpy
fi
"$venv/bin/python" -c 'import torch; print("peer-venv: torch", torch.__version__, "(MKL:", torch.backends.mkl.is_available(), "oneDNN:", torch.backends.mkldnn.is_available(), ")")'
echo "peer-venv: run the benchmarks with --peer-python $venv/bin/python (or TANDEM_PEER_PYTHON=$venv/bin/python)"
