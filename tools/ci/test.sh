#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA too, when nvcc is there),
# runs the whole CTest suite, then proves `find_package(Tandem)` works for an outside project.
# The README's `tools/test.sh` runs this.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TANDEM_BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
"$root/tools/ci/deps.sh" test
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# TANDEM_WERROR=1 (as .ci/run sets it): every C++ warning is an error.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_BUILD_TESTS=ON -DTANDEM_WERROR="$([ "${TANDEM_WERROR:-0}" = 1 ] && echo ON || echo OFF)" \
  "${launcher[@]}"
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
"$root/tools/ci/check_install.sh" "$build"
