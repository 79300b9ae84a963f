#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the built-in default model on the
# built-in synthetic dataset with DDP over `mpirun -np ${NP:-2}`. Extra arguments go to
# tools/train (see `train --help`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_BUILD_DIR:-$root/build}
np=${NP:-2}
"$root/tools/deps.sh"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target train
mpi_flags=()
# Open MPI refuses root unless told, and more ranks than cores unless told.
[ "$(id -u)" -eq 0 ] && mpi_flags+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && mpi_flags+=(--oversubscribe)
exec mpirun -np "$np" "${mpi_flags[@]}" "$build/tools/train" "$@"
