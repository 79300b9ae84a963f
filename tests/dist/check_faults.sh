#!/usr/bin/env bash
# A rank that hangs or dies ends the whole job, promptly and with a non-zero status, and the
# surviving ranks say which collective timed out. Runs tests/dist/fault_rank.cpp (one case per
# CTest test, tests/CMakeLists.txt) under `timeout`, so a job that would hang fails here instead:
#
#   check_faults.sh FAULT_RANK MPIRUN stop|stop_escape|throw|throw_escape|threads
#
# The mpi cases run `mpirun -np 2`; the last rank stops itself (SIGSTOP) or throws between two
# training steps, and the job must end within TANDEM_DIST_TIMEOUT (3 s) + 10 s. The threads case
# runs the throw with the ranks as threads (dist::run_threads).
set -uo pipefail
prog=${1:?usage: check_faults.sh FAULT_RANK MPIRUN CASE}
mpirun=${2:?usage: check_faults.sh FAULT_RANK MPIRUN CASE}
case_name=${3:?usage: check_faults.sh FAULT_RANK MPIRUN CASE}

timeout_s=3
limit_s=$((timeout_s + 10))
export TANDEM_DIST_TIMEOUT=$timeout_s TANDEM_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

case $case_name in
  stop | throw) args=("$case_name") ;;
  stop_escape | throw_escape) args=("${case_name%_escape}" --escape) ;;
  threads) args=(threads) ;;
  *) echo "unknown case '$case_name'"; exit 2 ;;
esac
cmd=("$prog" "${args[@]}")
[ "$case_name" = threads ] || cmd=("$mpirun" -np 2 --oversubscribe "${cmd[@]}")

out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s%N)
# Twice the limit before `timeout` steps in: a job that ends late is measured and reported as
# late, one that hangs is killed (SIGKILL 5 s after SIGTERM if mpirun does not go).
timeout -k 5 $((2 * limit_s)) "${cmd[@]}" >"$out" 2>&1
rc=$?
elapsed=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
# A hung job leaves its ranks behind once `timeout` killed mpirun (a stopped one for good): end
# exactly this run's ranks, whose command line is the program and its arguments.
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  for pid in $(pgrep -f -x -- "$prog ${args[*]}"); do
    kill -CONT "$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
  done
fi

fail() {
  echo "FAIL ($case_name): $*"
  echo "---- output (exit status $rc, ${elapsed} s) ----"
  cat "$out"
  exit 1
}

[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung: killed by timeout after ${elapsed} s"
[ "$rc" -ne 0 ] || fail "the job ended with status 0 although a rank failed"
awk -v e="$elapsed" -v l="$limit_s" 'BEGIN { exit !(e <= l) }' ||
  fail "the job took ${elapsed} s to end; it must end within the timeout + 10 s (${limit_s} s)"
# The surviving rank (rank 0) names the collective that timed out or stopped, with its number
# and group: "allreduce #21 on group world (mpi, rank 0 of 2)".
grep -Eq "(allreduce|broadcast|barrier|allgather)[a-z_]* #[0-9]+ on group world \((mpi|threads), rank 0 of 2\)" "$out" ||
  fail "the surviving rank's output does not name the collective"
if [ "$case_name" = threads ]; then
  grep -q "rank 1 failed: \[fault_rank\] rank 1 gives up" "$out" || fail "rank 0 does not say why it stopped"
else
  grep -q "timed out after ${timeout_s}000 ms" "$out" || fail "the surviving rank does not report the timeout"
fi
printf 'ok (%s): exit status %d after %s s (limit %d s)\n' "$case_name" "$rc" "$elapsed" "$limit_s"
