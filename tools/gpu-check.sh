#!/usr/bin/env bash
# The one command for a GPU machine: builds Tandem for sm_90 (Release) into build-gpu, runs every
# CUDA test, then the rest of the suite, then tools/bench_gpu beside PyTorch-CUDA. Full logs go
# to $OUT (the device tool's folder) or ./gpu-check-logs; ONE short table is printed last.
#
#   tools/gpu-check.sh [all|build|test|bench]     (default all; stages share the build folder,
#                                                  so a short lease can run them in two calls)
# Environment: TANDEM_GPU_BUILD (build folder, default <repo>/build-gpu), JOBS (default 16),
# CUDA_ARCH (default 90), BENCH_RUNS (default 7), TANDEM_DEPS (a folder of .deb files for
# packages the machine lacks: each is unpacked with dpkg -x into <build>/deps-root, which is put
# on the compiler's, linker's and loader's paths; nothing is installed into /).
#
# Exit status: 0 when everything passed; 1 tests failed; 2 configure or build failed; 3 no usable
# CUDA device (after building: the build is still checked); 4 the benchmark failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_GPU_BUILD:-$root/build-gpu}
jobs=${JOBS:-16}
arch=${CUDA_ARCH:-90}
runs=${BENCH_RUNS:-7}
stage=${1:-all}
logs=${OUT:-$root/gpu-check-logs}
mkdir -p "$logs"
case "$stage" in all|build|test|bench) ;; *) echo "usage: $0 [all|build|test|bench]" >&2; exit 2 ;; esac

summary=()   # "check|result" lines for the final table
note() { summary+=("$1|$2"); }
status=0
fail_with() { [ "$status" -eq 0 ] && status=$1; }

print_summary() {
  echo
  echo "== gpu-check ($stage) on $(hostname) — full logs in $logs =="
  printf '| %-14s | %s\n' "check" "result"
  printf '|%s|%s\n' "----------------" "--------------------------------------------------"
  for s in "${summary[@]}"; do printf '| %-14s | %s\n' "${s%%|*}" "${s#*|}"; done
  if [ -s "$logs/bench_table.txt" ]; then
    echo
    cat "$logs/bench_table.txt"
  fi
}
trap print_summary EXIT

# ---------------------------------------------------------------- environment
{
  echo "date: $(date -u +%FT%TZ)"; echo "repo: $root"; uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -2
  [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version | tail -1
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1
  git -C "$root" log --oneline -1 2>/dev/null
} > "$logs/env.txt" 2>&1

if [ -n "${TANDEM_DEPS:-}" ] && [ -d "$TANDEM_DEPS" ]; then
  deps_root="$build/deps-root"
  mkdir -p "$deps_root"
  for f in "$TANDEM_DEPS"/*.deb; do [ -e "$f" ] && dpkg -x "$f" "$deps_root"; done
  multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  export CMAKE_PREFIX_PATH="$deps_root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="$deps_root/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$deps_root/usr/lib/$multiarch:$deps_root/usr/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$deps_root/usr/lib/$multiarch:$deps_root/usr/lib/$multiarch/openblas-pthread:$deps_root/usr/lib/$multiarch/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$deps_root/usr/bin:$PATH"
  export OPAL_PREFIX="$deps_root/usr"  # lets a relocated Open MPI find its own files
  echo "deps: unpacked $(ls "$TANDEM_DEPS"/*.deb 2>/dev/null | wc -l) packages into $deps_root" >> "$logs/env.txt"
fi

# ---------------------------------------------------------------- build
if [ "$stage" = all ] || [ "$stage" = build ]; then
  nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  t0=$SECONDS
  if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      "${launcher[@]}" > "$logs/configure.log" 2>&1; then
    note configure "ok ($((SECONDS - t0)) s, sm_$arch)"
  else
    note configure "FAILED: $(grep -m1 -E 'Could NOT find|Error|error' "$logs/configure.log" | cut -c1-110) (configure.log)"
    exit 2
  fi
  t0=$SECONDS
  if cmake --build "$build" -j "$jobs" > "$logs/build.log" 2>&1; then
    note build "ok ($((SECONDS - t0)) s, -j$jobs)"
  else
    note build "FAILED after $((SECONDS - t0)) s: $(grep -m1 -E 'error' "$logs/build.log" | cut -c1-110) (build.log)"
    exit 2
  fi
fi

# ---------------------------------------------------------------- device
if [ ! -x "$build/tools/bench_gpu" ]; then
  note device "not checked: $build/tools/bench_gpu is not built (run the build stage)"
  exit 2
fi
if "$build/tools/bench_gpu" --check > "$logs/device.txt" 2>&1; then
  note device "$(head -1 "$logs/device.txt" | cut -c1-110)"
else
  note device "no usable CUDA device: $(sed 's/^bench_gpu: no usable CUDA device //' "$logs/device.txt" | head -1 | cut -c1-100)"
  echo "gpu-check: no usable CUDA device here; built only, nothing run (see $logs/device.txt)" >&2
  exit 3
fi
[ "$stage" = build ] && exit 0

# ---------------------------------------------------------------- tests
# "N% tests passed, F tests failed out of T" -> "P passed, F failed (of T)" plus the failed names.
ctest_result() {
  local log=$1 line total failed
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of' "$log" | tail -1)
  if [ -z "$line" ]; then
    grep -q 'No tests were found' "$log" && { echo "no tests found"; return; }
    echo "did not finish (see $(basename "$log"))"; return
  fi
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")
  failed=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")
  local names
  names=$(sed -n '/The following tests FAILED/,$p' "$log" | grep -E '^\s+[0-9]+ - ' | sed -E 's/^\s+[0-9]+ - //; s/ \(.*//' | head -5 | paste -sd, -)
  echo "$((total - failed)) passed, $failed failed (of $total)${names:+: $names}"
}

if [ "$stage" = all ] || [ "$stage" = test ]; then
  t0=$SECONDS
  # -V keeps every test's output, so a CUDA test that skipped instead of running shows up.
  ctest --test-dir "$build" -R '^test_cuda' -j 8 --timeout 300 -V > "$logs/ctest_cuda.log" 2>&1
  cuda_rc=$?
  note cuda-tests "$(ctest_result "$logs/ctest_cuda.log") in $((SECONDS - t0)) s"
  skipped=$(grep -c 'SKIP: no usable CUDA device' "$logs/ctest_cuda.log")
  [ "$skipped" -gt 0 ] && { note cuda-skips "$skipped CUDA tests skipped for want of a device"; fail_with 1; }
  [ $cuda_rc -ne 0 ] && fail_with 1
  t0=$SECONDS
  ctest --test-dir "$build" -E '^test_cuda' -j "$jobs" --timeout 300 --output-on-failure > "$logs/ctest_rest.log" 2>&1
  rest_rc=$?
  note other-tests "$(ctest_result "$logs/ctest_rest.log") in $((SECONDS - t0)) s"
  [ $rest_rc -ne 0 ] && fail_with 1
fi

# ---------------------------------------------------------------- bench
if [ "$stage" = all ] || [ "$stage" = bench ]; then
  t0=$SECONDS
  "$build/tools/bench_gpu" --runs "$runs" --json-out "$logs/bench.json" \
      --peer-script "$root/tools/bench_gpu_peer.py" > "$logs/bench_table.txt" 2> "$logs/bench_stderr.log"
  bench_rc=$?
  if [ $bench_rc -eq 0 ]; then
    note bench "ok ($((SECONDS - t0)) s; rows below, JSON in bench.json)"
  else
    note bench "exit $bench_rc after $((SECONDS - t0)) s: $(head -1 "$logs/bench_stderr.log" | cut -c1-100) (bench_stderr.log)"
    fail_with 4
  fi
  grep -q 'peer not available' "$logs/bench_stderr.log" && note bench-peer "PyTorch peer did not run (bench_stderr.log)"
fi
exit $status
