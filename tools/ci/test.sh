#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA too, when nvcc is there),
# runs the whole CTest suite, then proves `find_package(Tandem)` works for an outside project.
# The README's `tools/test.sh` runs this.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TANDEM_BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
"$root/tools/ci/deps.sh"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}"
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
"$root/tools/ci/check_install.sh" "$build"
