#!/usr/bin/env bash
# The main job: installs what is missing (Fashion-MNIST included), builds, and trains train's
# default, the CNN on Fashion-MNIST (8 epochs, SGD with momentum, lr 0.05 on a cosine schedule: the
# recipe in tools/train/models.h), with DDP over `mpirun -np ${NP:-2}`, to >= 91.5% test accuracy.
# Extra arguments go to build/tools/train (see `train --help`): `--model mlp` trains the MLP instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_BUILD_DIR:-$root/build}
np=${NP:-2}
"$root/tools/ci/deps.sh" train  # what building and running train needs, not the tests' stack
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target train
mpi_flags=()
# Open MPI refuses root unless told, and more ranks than cores unless told.
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && mpi_flags+=(--oversubscribe)
exec mpirun -np "$np" "${mpi_flags[@]}" "$build/tools/train" "$@"
