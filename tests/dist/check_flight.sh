#!/usr/bin/env bash
# The flight recorder names the culprit: tests/dist/flight_rank.cpp runs under `mpirun -np 4`
# with TANDEM_FLIGHT_RECORDER set, one rank misbehaves, and flight_report reads the dumps:
#
#   check_flight.sh FLIGHT_RANK FLIGHT_REPORT MPIRUN clean|skip|size|stop|usr1
#
#   clean  every rank dumps at exit; the report finds the ranks in agreement (status 0)
#   skip   rank 3 skipped bucket 0's allreduce: the report names rank 3, the collective and the skip
#   size   rank 2 averaged 1000 elements where the others averaged 1: the report names rank 2
#   stop   rank 1 stopped (SIGSTOP): the survivors' timeout names rank 1 as not answering, and the
#          report names the collective ranks 0, 2, 3 entered and rank 1 never did
#   usr1   SIGUSR1 makes every rank dump (the job itself checks its files)
#   join   under a Join, rank 3 runs out of data while the loop averages its loss every step: every
#          rank's error names both collectives and the Join's rule
#
# Where ranks ran different collectives (skip, size, join) every rank must end within 10 s, well
# inside its 30 s timeout, its error naming the mismatch in Tandem's words (no MPI error text, no
# source path): the rank that finds it tells the others, which stop waiting at once.
set -uo pipefail
prog=${1:?usage: check_flight.sh FLIGHT_RANK FLIGHT_REPORT MPIRUN CASE}
report_tool=${2:?usage: check_flight.sh FLIGHT_RANK FLIGHT_REPORT MPIRUN CASE}
mpirun=${3:?usage: check_flight.sh FLIGHT_RANK FLIGHT_REPORT MPIRUN CASE}
case_name=${4:?usage: check_flight.sh FLIGHT_RANK FLIGHT_REPORT MPIRUN CASE}

dir=$(mktemp -d)
out=$dir/job.log
report=$dir/report.txt
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/dumps"
# A short timeout where a rank stops (the survivors' timeout is what is checked); a long one where
# the ranks run different collectives, so that ending "within moments" cannot be the timeout.
timeout_s=3
case $case_name in skip | size | join) timeout_s=30 ;; esac
export TANDEM_FLIGHT_RECORDER=$dir/dumps TANDEM_DIST_TIMEOUT=$timeout_s TANDEM_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

started=$SECONDS
timeout -k 5 60 "$mpirun" -np 4 --oversubscribe "$prog" "$case_name" >"$out" 2>&1
rc=$?
elapsed=$((SECONDS - started))
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  for pid in $(pgrep -f -x -- "$prog $case_name"); do
    kill -CONT "$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
  done
fi
"$report_tool" "$dir/dumps" >"$report" 2>&1
report_rc=$?

fail() {
  echo "FAIL ($case_name): $*"
  echo "---- job output (exit status $rc) ----"
  cat "$out"
  echo "---- flight_report (exit status $report_rc) ----"
  cat "$report"
  exit 1
}
expect_report() {  # an extended regular expression the report must hold
  grep -Eq -- "$1" "$report" || fail "the report does not say: $1"
}

[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "the job hung: killed by timeout"
# Every rank's error line names the mismatch, in Tandem's words, and the job ends soon after the
# first rank finds it.
expect_mismatch_on_every_rank() {
  [ "$elapsed" -le 10 ] || fail "the job took ${elapsed} s: the ranks did not learn of the mismatch within moments (timeout ${timeout_s} s)"
  for r in 0 1 2 3; do
    line=$(grep "^flight_rank (rank $r): " "$out")
    [ -n "$line" ] || fail "rank $r printed no error"
    echo "$line" | grep -q "the ranks are not running the same collective" ||
      fail "rank $r's error does not name the mismatch: $line"
    for pattern in "$@"; do
      echo "$line" | grep -qF -- "$pattern" || fail "rank $r's error does not say '$pattern': $line"
    done
    if echo "$line" | grep -qE 'MPI_|\.(cpp|h):[0-9]'; then fail "rank $r's error shows MPI's text or a source path: $line"; fi
  done
}
dumps=$(ls "$dir/dumps" | grep -c '^tandem_flight_rank[0-9]*\.json$')
case $case_name in
  clean)
    [ "$rc" -eq 0 ] || fail "the job failed"
    [ "$dumps" -eq 4 ] || fail "$dumps dumps, want 4 (one per rank, at exit)"
    grep -q '"reason": "exit"' "$dir/dumps/tandem_flight_rank3.json" || fail "rank 3's dump is not the exit's"
    [ "$report_rc" -eq 0 ] || fail "flight_report found a problem in a clean run"
    expect_report "group world \(4 ranks, mpi\):"
    expect_report "the ranks agree on collectives #0 to #[0-9]+; the last, allreduce avg f32\[1\] \(loss average\), is completed"
    ;;
  skip)
    [ "$report_rc" -eq 1 ] || fail "flight_report did not report the skip"
    expect_report "the ranks disagree at collective #[0-9]+:"
    expect_report "ranks 0, 1, 2 issued allreduce avg f32\[[0-9]+\] \(ddp bucket 0\)"
    expect_report "rank 3 issued allreduce avg f32\[[0-9]+\] \(ddp bucket 1\)"
    expect_report "rank 3 skipped #[0-9]+ \(allreduce avg f32\[[0-9]+\] \(ddp bucket 0\)\)"
    expect_mismatch_on_every_rank "allreduce avg f32[528] (ddp bucket 1)" "allreduce avg f32[288] (ddp bucket 0)"
    ;;
  size)
    [ "$report_rc" -eq 1 ] || fail "flight_report did not report the size mismatch"
    expect_report "the ranks disagree at collective #[0-9]+:"
    expect_report "ranks 0, 1, 3 issued allreduce avg f32\[1\] \(loss average\)"
    expect_report "rank 2 issued allreduce avg f32\[1000\] \(loss average\)"
    expect_mismatch_on_every_rank "allreduce avg f32[1000] (loss average)" "allreduce avg f32[1] (loss average)"
    ;;
  join)
    [ "$rc" -ne 0 ] || fail "the job ended with status 0 although a collective met a Join's announcement"
    expect_mismatch_on_every_rank "(join announcement)" "(loss average)" \
      "Under a dist::Join a rank that has run out of data shadows only the joinables' collectives"
    ;;
  stop)
    [ "$rc" -ne 0 ] || fail "the job ended with status 0 although a rank stopped"
    grep -Eq "timed out after 3000 ms; the group is broken: rank 1 did not arrive: it did not answer" "$out" ||
      fail "the survivors' timeout error does not name rank 1"
    grep -q "TANDEM_DIST_DEBUG=detail compares each one across the ranks" "$out" ||
      fail "the timeout error does not name the setting that compares the ranks' collectives"
    # Rank 1 normally leaves no dump; when mpirun lets it go again (SIGCONT) before ending it, its
    # responder may still write one, which then shows it past the collective: the survivors'
    # timeouts name it either way.
    expect_report "collective #[0-9]+ allreduce [a-z]+ f32\[[0-9]+\] \(ddp bucket 0\) (was entered by ranks 0, 2, 3 \(failed\) and never by rank 1|timed out on ranks 0, 2, 3, which found rank 1 missing)"
    ;;
  usr1)
    [ "$rc" -eq 0 ] || fail "the job failed"
    n=$(grep -c "dumped on SIGUSR1" "$out")
    [ "$n" -eq 4 ] || fail "$n ranks saw their SIGUSR1 dump, want 4"
    [ "$report_rc" -eq 0 ] || fail "flight_report found a problem in a run that only dumped"
    ;;
  *) echo "unknown case '$case_name'"; exit 2 ;;
esac
echo "ok ($case_name): job status $rc, $dumps dumps; the report:"
cat "$report"
