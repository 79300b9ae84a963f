#!/usr/bin/env bash
# Sanitizer runs of the CPU tests, and the fuzzers.
#
#   tools/ci/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included)
#                               over the CPU suite through CTest: every test program, the mpirun
#                               suites at 2 and 4 ranks, the fault and tool checks; less, to keep
#                               CI within its time, three runs the Release suite already makes
#                               that repeat code covered here (ASAN_SKIP, below; ASAN_SKIP= runs all)
#   tools/ci/sanitize.sh tsan   ThreadSanitizer over the tests that run several threads in one
#                               process (the threads backend's ranks, its comm threads, DDP's reducer,
#                               hooks from workers): test_autograd test_dist test_ddp test_readme
#                               test_optim_in_backward
#   tools/ci/sanitize.sh fuzz   the libFuzzer targets of tools/fuzz/ (fuzz_safetensors, fuzz_idx,
#                               fuzz_ops, fuzz_seq_ops, fuzz_collectives), built with clang-14 under
#                               ASan + UBSan, each run for a fixed number of inputs from its committed
#                               seed corpus
#   tools/ci/sanitize.sh replay the same fuzz build, each target run once on every input committed
#                               under tools/fuzz/corpus/<name>/ (seeds, every past finding's crash-*,
#                               the merged corpora of past campaigns): no mutation, no randomness, so
#                               the same commit gets the same verdict on any machine
#   tools/ci/sanitize.sh ci     asan, tsan and replay in turn (what .ci/run does after the test
#                               command); exits non-zero if any of them failed, after running them all
#
# The gate and the search are apart: `replay` is the gate (CI), `fuzz` is the search. libFuzzer's
# mutations depend on the machine (build paths, address layout, timing) even from a fixed seed, so
# a search in CI would fail a submission for a bug its change did not touch, by luck of the draw.
# Search with `fuzz` on what you change (a few minutes of fuzz_ops whenever core or autograd
# changed; longer campaigns with FUZZ_RUNS / FUZZ_TIME), then commit each finding's input as a
# crash-* seed beside its fix and regression test, so `replay` holds it from then on.
#
# Each builds a CPU-only tree (build-asan / build-tsan / build-fuzz beside build/; -O1 with line
# tables, ccache when there) and exits non-zero when a test fails, a fuzzer finds a crash, or a
# sanitizer reports anything. Extra arguments: for asan, a CTest regex (-R) choosing the tests;
# for tsan, the test programs to run; for fuzz, the targets. JOBS sets the build's and CTest's
# parallelism (default 2); TANDEM_SANITIZE_BUILD_DIR overrides the build folder (one mode only).
#
# Suppressions, each commented in its file: tools/ci/lsan.supp (leaks wholly inside Open MPI),
# tools/ci/tsan.supp (one libstdc++ exception_ptr handover), tools/ci/ubsan.supp (integer tensor
# elements that wrap and float-to-integer element casts, as PyTorch leaves them).
#
# fuzz: FUZZ_RUNS sets the inputs per target (default 100000), FUZZ_RUNS_<target> one target's; FUZZ_TIME caps each
# target's seconds (default 600: a run that stops there says so and fails); FUZZ_ENTROPIC=1 turns
# libFuzzer's entropic schedule back on (off by default: see below); FUZZ_SEED fixes
# libFuzzer's seed (default: a random one, printed); FUZZ_KEEP=1 keeps build-fuzz/fuzz-corpus/<name>/
# from the last run as the starting corpus (a campaign in several legs). Seeds are copied from tools/fuzz/corpus/<name>/
# to build-fuzz/fuzz-corpus/<name>/ (the committed corpus is never written to); logs and any
# crashing input (crash-*, timeout-*, oom-*, leak-*) land in build-fuzz/fuzz-logs/. Reproduce one
# with `build-fuzz/tools/fuzz/fuzz_<name> build-fuzz/fuzz-logs/<name>/crash-...`. A failure also prints
# the log's end and the input in base64 (`base64 -d >crash` rebuilds it from a CI log).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kind=${1:-}
shift || true
jobs=${JOBS:-2}

if [ "$kind" = ci ]; then
  # One after the other (two cores); each mode's summary is its last lines. Every part is
  # deterministic: the fuzzers only replay committed inputs (see `replay` above).
  status=0
  for mode in asan tsan replay; do
    start=$SECONDS
    echo "=== sanitize.sh $mode"
    TANDEM_SANITIZE_BUILD_DIR="" "$0" "$mode" || status=1
    echo "=== sanitize.sh $mode: $((SECONDS - start)) s"
  done
  exit $status
fi

# -g1: line tables for the reports' stacks, at a fraction of -g's compile time.
case "$kind" in
  tsan)
    flags="-fsanitize=thread -g1 -O1"
    link="-fsanitize=thread"
    ;;
  asan)
    # UBSan checks recoverable so tools/ci/ubsan.supp can suppress the element-value ones;
    # halt_on_error=1 below still stops at the first report that is not suppressed.
    flags="-fsanitize=address,undefined -fsanitize-recover=undefined -g1 -O1 -fno-omit-frame-pointer"
    link="-fsanitize=address,undefined"
    ;;
  fuzz|replay)
    # Coverage instrumentation everywhere (fuzzer-no-link); only the fuzzers link libFuzzer's main
    # (tools/fuzz/CMakeLists.txt adds -fsanitize=fuzzer to them).
    flags="-fsanitize=fuzzer-no-link,address,undefined -fsanitize-recover=undefined -gline-tables-only -O1 -fno-omit-frame-pointer"
    link="-fsanitize=address,undefined"
    ;;
  *)
    echo "usage: $0 asan|tsan|fuzz|replay|ci [ctest_regex | test_program... | fuzz_target...]" >&2
    exit 2
    ;;
esac
# clang-14 and libFuzzer for fuzz, the rest as for the tests: installed when missing (idempotent).
"$root/tools/ci/deps.sh" test
args=("$@")
build=${TANDEM_SANITIZE_BUILD_DIR:-$root/build-$kind}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# CMAKE_BUILD_TYPE=None: no -O2/-O3/-DNDEBUG on top of ours, so asserts stay on.
common=(-DCMAKE_BUILD_TYPE=None -DTANDEM_CUDA=OFF "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$link"
        "-DCMAKE_SHARED_LINKER_FLAGS=$link" "${launcher[@]}")
export TANDEM_NUM_THREADS=1
export UBSAN_SUPPRESSIONS=$root/tools/ci/ubsan.supp

if [ "$kind" = fuzz ] || [ "$kind" = replay ]; then
  # clang for libFuzzer; tests and tools off: only the library and the fuzz targets are built.
  build=${TANDEM_SANITIZE_BUILD_DIR:-$root/build-fuzz}
  fuzz_dir=$root/tools/fuzz
  tests=("${args[@]}")
  [ ${#tests[@]} -gt 0 ] || tests=(fuzz_safetensors fuzz_idx fuzz_ops fuzz_seq_ops fuzz_collectives)
  CC=${CC:-clang-14} CXX=${CXX:-clang++-14} cmake -S "$root" -B "$build" "${common[@]}" \
    -DTANDEM_BUILD_TOOLS=OFF -DTANDEM_BUILD_TESTS=OFF -DTANDEM_FUZZ=ON >/dev/null
  cmake --build "$build" -j "$jobs" --target "${tests[@]}"

  logs=$build/fuzz-logs
  # fuzz_common.h sets allocator_may_return_null and max_allocation_size_mb; these add to it.
  export ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}"
  export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 suppressions=$UBSAN_SUPPRESSIONS ${UBSAN_OPTIONS:-}"
  # Sanitizer and libFuzzer reports, and the fuzzers' own findings ("fuzz_ops: expectation failed").
  report_pattern='^==[0-9]+==ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|^SUMMARY: '
  report_pattern+='|deadly signal|^fuzz_[a-z_]+: '
  status=0
  if [ "$kind" = replay ]; then
    for t in "${tests[@]}"; do
      name=${t#fuzz_}
      inputs=("$fuzz_dir/corpus/$name"/*)
      [ -e "${inputs[0]}" ] || { echo "== replay: $t: no committed inputs in tools/fuzz/corpus/$name"; status=1; continue; }
      mkdir -p "$logs"
      start=$SECONDS
      rc=0
      # Files, not a folder: libFuzzer runs each input once, exactly as committed, and fuzzes nothing.
      # In batches, so the command line stays short whatever the corpus size.
      : >"$logs/$t.replay.log"
      printf '%s\0' "${inputs[@]}" | xargs -0 -n 500 "$build/tools/fuzz/$t" -timeout=30 -rss_limit_mb=2048 \
        >>"$logs/$t.replay.log" 2>&1 || rc=$?
      ran=$(grep -c '^Executed ' "$logs/$t.replay.log" || true)
      if [ $rc -ne 0 ] || grep -qE "$report_pattern" "$logs/$t.replay.log" || [ "$ran" -ne ${#inputs[@]} ]; then
        echo "== replay: $t FAILED (exit $rc, $ran of ${#inputs[@]} inputs ran), log: $logs/$t.replay.log"
        first=$(grep -nE "$report_pattern|^terminate called" "$logs/$t.replay.log" | head -n 1 | cut -d: -f1)
        # The input that failed is the last one started.
        grep -E '^Running: ' "$logs/$t.replay.log" | tail -n 1 | sed 's/^/   /'
        tail -n +"${first:-1}" "$logs/$t.replay.log" | head -n 60 | sed 's/^/   | /'
        status=1
      else
        echo "== replay: $t: ${#inputs[@]} inputs clean, $((SECONDS - start)) s"
      fi
    done
    if [ $status -eq 0 ]; then echo "replay: clean"; else echo "replay: findings or failures above"; fi
    exit $status
  fi
  for t in "${tests[@]}"; do
    name=${t#fuzz_}
    runs_var=FUZZ_RUNS_$t
    runs=${!runs_var:-${FUZZ_RUNS:-100000}}
    max_time=${FUZZ_TIME:-600}
    corpus=$build/fuzz-corpus/$name
    [ "${FUZZ_KEEP:-0}" = 1 ] || rm -rf "$corpus"
    rm -rf "$logs/$name" "$logs/$t.log"
    mkdir -p "$corpus" "$logs/$name"
    [ -d "$fuzz_dir/corpus/$name" ] && cp "$fuzz_dir/corpus/$name"/* "$corpus"/ 2>/dev/null || true
    echo "== fuzz: $t ($runs runs, seeds: $(ls "$corpus" | wc -l))"
    seed=()
    [ -n "${FUZZ_SEED:-}" ] && seed=(-seed="$FUZZ_SEED")
    start=$SECONDS
    rc=0
    # -timeout: one input running 30 s is a hang; -max_total_time: the guard on the whole run.
    # -entropic=0: libFuzzer's entropic schedule spent 67% of fuzz_ops' time in its own feature
    # bookkeeping (AddRareFeature, UpdateFeatureFrequency: perf, 25 s); without it a worker runs
    # about 2,000 inputs/s instead of 370-550. FUZZ_ENTROPIC=1 brings it back.
    "$build/tools/fuzz/$t" -runs="$runs" -max_total_time="$max_time" -timeout=30 -rss_limit_mb=2048 \
      -entropic="${FUZZ_ENTROPIC:-0}" -print_final_stats=1 -artifact_prefix="$logs/$name/" "${seed[@]}" "$corpus" >"$logs/$t.log" 2>&1 || rc=$?
    elapsed=$((SECONDS - start))
    done_runs=$(grep -oE '^Done [0-9]+ runs' "$logs/$t.log" | grep -oE '[0-9]+' || true)
    grep -oE '^INFO: Seed: [0-9]+' "$logs/$t.log" | sed 's/^INFO: /   /' || true
    if [ $rc -ne 0 ] || grep -qE "$report_pattern" "$logs/$t.log"; then
      echo "   FAILED (exit $rc), log: $logs/$t.log"
      # The report, from its first line (a sanitizer's, an uncaught exception's "terminate called",
      # a fuzzer's own finding) to the log's end: the stack, libFuzzer's summary and, for inputs up to
      # 256 bytes, the input in base64 ("Base64:"), so a CI failure replays without its files.
      first=$(grep -nE "$report_pattern|^terminate called" "$logs/$t.log" | head -n 1 | cut -d: -f1)
      tail -n +"${first:-1}" "$logs/$t.log" | grep -vE '^#[0-9]+\s+(pulse|NEW|REDUCE|INITED|RELOAD)' |
        head -n 80 | sed 's/^/   | /'
      # libFuzzer prints no Base64 line for a longer input: printed here.
      for artifact in "$logs/$name"/crash-* "$logs/$name"/timeout-* "$logs/$name"/oom-* "$logs/$name"/leak-*; do
        [ -f "$artifact" ] && [ "$(stat -c %s "$artifact")" -gt 256 ] || continue
        echo "   input $(basename "$artifact") ($(stat -c %s "$artifact") bytes), base64:"
        head -c 8192 "$artifact" | base64 -w 100 | sed 's/^/   > /'
      done
      status=1
    elif [ "${done_runs:-0}" -lt "$runs" ]; then
      echo "   STOPPED by the ${max_time} s guard after ${done_runs:-0} of $runs runs, log: $logs/$t.log"
      status=1
    else
      echo "   $done_runs runs, $elapsed s, corpus $(ls "$corpus" | wc -l) inputs"
    fi
  done
  if [ $status -eq 0 ]; then echo "fuzz: clean"; else echo "fuzz: findings or failures above"; fi
  exit $status
fi

logs=$build/sanitize-logs
report_pattern='^WARNING: ThreadSanitizer|^==[0-9]+==ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:'
# Reports go to files (log_path appends .<pid>), so a report is seen even when the test passes,
# and from every process: mpirun's ranks and the programs the check scripts start inherit these.
case "$kind" in
  tsan)
    export TSAN_OPTIONS="halt_on_error=0 second_deadlock_stack=1 suppressions=$root/tools/ci/tsan.supp log_path=$logs/report ${TSAN_OPTIONS:-}"
    ;;
  asan)
    # fast_unwind_on_malloc=0: Open MPI unloads its components (mca_*.so, built without frame
    # pointers) in MPI_Finalize, before LeakSanitizer looks; the frame-pointer unwinder stops in
    # them at allocation time, leaving stacks that name no library tools/ci/lsan.supp could match.
    # The DWARF unwinder walks on to libmpi / libopen-rte, which stay loaded.
    export ASAN_OPTIONS="detect_leaks=1 fast_unwind_on_malloc=0 log_path=$logs/report ${ASAN_OPTIONS:-}"
    export LSAN_OPTIONS="suppressions=$root/tools/ci/lsan.supp print_suppressions=0 ${LSAN_OPTIONS:-}"
    export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 suppressions=$UBSAN_SUPPRESSIONS log_path=$logs/report ${UBSAN_OPTIONS:-}"
    ;;
esac

# Prints each report file's summary lines; returns 1 when there is any.
scan_reports() {  # label
  local found=0 r n
  for r in "$logs"/report.*; do
    [ -e "$r" ] || continue
    n=$(grep -cE "$report_pattern" "$r" || true)
    [ "$n" -gt 0 ] || { rm -f "$r"; continue; }
    mv "$r" "$logs/$1.$(basename "$r")"
    r=$logs/$1.$(basename "$r")
    echo "   sanitizer report: $r ($n reports)"
    grep -E "^SUMMARY|runtime error:" "$r" | sort | uniq -c | head -n 10 | sed 's/^/   | /'
    found=1
  done
  return $found
}

if [ "$kind" = asan ]; then
  # The sanitizer options are unset while building: catch_discover_tests runs each test program to
  # list its cases, and those runs' leak reports (Open MPI's, unsuppressed there) are not findings.
  (unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
   cmake -S "$root" -B "$build" "${common[@]}" -DTANDEM_BUILD_TOOLS=ON >/dev/null
   ASAN_OPTIONS=detect_leaks=0 cmake --build "$build" -j "$jobs")
  rm -rf "$logs"
  mkdir -p "$logs"
  regex=()
  [ ${#args[@]} -gt 0 ] && regex=(-R "${args[0]}")
  # Skipped under ASan (the Release suite runs them): the mpi suites' second progress mode (the
  # caller mode, their default here, drives the same reducer and ring code), the 4-rank leak loop
  # (the 2-rank one runs the same constructions), and the SIGKILL-during-save check (file writes,
  # 58 s under ASan). About 100 s of the run.
  skip=${ASAN_SKIP-'(:thread$|^test_leaks_mpi:np4$|^test_checkpoint_kill)'}
  [ -n "$skip" ] && regex+=(-E "$skip")
  status=0
  start=$SECONDS
  # The timeout multiplier: ASan + UBSan at -O1 run the suite several times slower.
  ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 1500 "${regex[@]}" \
    >"$logs/ctest.out" 2>&1 || status=1
  grep -E "tests passed|tests failed|^\s+[0-9]+ - |Total Test time" "$logs/ctest.out" | sed 's/^/   /'
  scan_reports asan || status=1
  echo "   $((SECONDS - start)) s, CTest output: $logs/ctest.out"
  if [ $status -eq 0 ]; then echo "asan: clean"; else echo "asan: reports or failures above"; fi
  exit $status
fi

tests=("${args[@]}")
[ ${#tests[@]} -gt 0 ] || tests=(test_autograd test_dist test_ddp test_readme test_optim_in_backward)
cmake -S "$root" -B "$build" "${common[@]}" -DTANDEM_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target "${tests[@]}"
rm -rf "$logs"
mkdir -p "$logs"
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
  # A program with no test cases registered could not start its suite.
  if grep -q '^No tests ran' "$logs/$t.out"; then
    echo "   no test cases ran"
    status=1
  fi
  scan_reports "$t" || status=1
  echo "   $((SECONDS - start)) s"
done
if [ $status -eq 0 ]; then echo "$kind: clean"; else echo "$kind: reports or failures above"; fi
exit $status
