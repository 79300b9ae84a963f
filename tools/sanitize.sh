#!/usr/bin/env bash
# Sanitizer runs of the CPU tests. Not part of CI (yet).
#
#   tools/sanitize.sh tsan   ThreadSanitizer over the tests that run several threads (the threads
#                            backend's ranks, its comm threads, DDP's reducer, hooks from workers):
#                            test_autograd test_dist test_ddp test_readme test_optim_in_backward
#   tools/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer over the same tests
#
# Either builds a CPU-only tree (build-tsan / build-asan beside build/; -g -O1, ccache when there)
# and exits non-zero when a test fails or the sanitizer reports anything. Extra arguments name the
# test programs to run instead of the default set. JOBS sets the build's parallelism (default 2);
# TANDEM_SANITIZE_BUILD_DIR overrides the build folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-}
shift || true
case "$kind" in
  tsan)
    flags="-fsanitize=thread -g -O1"
    link="-fsanitize=thread"
    ;;
  asan)
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -g -O1 -fno-omit-frame-pointer"
    link="-fsanitize=address,undefined"
    ;;
  *)
    echo "usage: $0 tsan|asan [test_program...]" >&2
    exit 2
    ;;
esac
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(test_autograd test_dist test_ddp test_readme test_optim_in_backward)
build=${TANDEM_SANITIZE_BUILD_DIR:-$root/build-$kind}
jobs=${JOBS:-2}

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# CMAKE_BUILD_TYPE=None: no -O2/-O3/-DNDEBUG on top of ours, so asserts stay on.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=None -DTANDEM_CUDA=OFF -DTANDEM_BUILD_TOOLS=OFF \
  "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$link" "-DCMAKE_SHARED_LINKER_FLAGS=$link" \
  "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$jobs" --target "${tests[@]}"

logs=$build/sanitize-logs
rm -rf "$logs"
mkdir -p "$logs"
export TANDEM_NUM_THREADS=1
# Reports go to files (log_path appends .<pid>), so a report is seen even when the test passes.
case "$kind" in
  tsan)
    export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$root/tools/tsan.supp log_path=$logs/report ${TSAN_OPTIONS:-}"
    ;;
  asan)
    export ASAN_OPTIONS="detect_leaks=1 log_path=$logs/report ${ASAN_OPTIONS:-}"
    export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 log_path=$logs/report ${UBSAN_OPTIONS:-}"
    ;;
esac

report_pattern='^WARNING: ThreadSanitizer|^==[0-9]+==ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:'
status=0
for t in "${tests[@]}"; do
  exe=$build/tests/$t
  echo "== $kind: $t"
  start=$SECONDS
  rc=0
  "$exe" >"$logs/$t.out" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    echo "   FAILED (exit $rc), output: $logs/$t.out"
    tail -n 20 "$logs/$t.out" | sed 's/^/   | /'
    status=1
  fi
  tail -n 3 "$logs/$t.out" | grep -E '^(All tests passed|test cases)' | sed 's/^/   /' || true
  # Tests with no test cases registered mean the program could not start its suite.
  if grep -q '^No tests ran' "$logs/$t.out"; then
    echo "   no test cases ran"
    status=1
  fi
  # Most reports land in report.<pid>; UBSan's (under ASan) go to the test's own output.
  for r in "$logs"/report.* "$logs/$t.out"; do
    [ -e "$r" ] || continue
    n=$(grep -cE "$report_pattern" "$r" || true)
    [ "$r" = "$logs/$t.out" ] && [ "$n" -eq 0 ] && continue
    if [ "$r" != "$logs/$t.out" ]; then
      mv "$r" "$logs/$t.$(basename "$r")"
      r=$logs/$t.$(basename "$r")
    fi
    echo "   sanitizer report: $r ($n reports)"
    grep -E "^SUMMARY|runtime error:" "$r" | sort | uniq -c | head -n 10 | sed 's/^/   | /'
    status=1
  done
  echo "   $((SECONDS - start)) s"
done
if [ $status -eq 0 ]; then echo "$kind: clean"; else echo "$kind: reports or failures above"; fi
exit $status
