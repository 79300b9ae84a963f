#!/usr/bin/env bash
# train --zero (dist::ZeroRedundancyOptimizer, ZeRO stage 1) under mpirun:
#   - at 2 ranks it ends with the same bits as the run without --zero: the parameters, and the
#     optimizer state its checkpoint consolidates on rank 0 (the plain optimizer's format);
#   - interrupted at step M and resumed at 2 ranks, it ends as the uninterrupted run;
#   - the checkpoint written at 2 ranks resumes at 1 and at 4 ranks, with --zero or without, and
#     both end with the same bits (at a new rank count the shards of the data differ, so the run
#     is compared with the plain optimizer's run from the same checkpoint at that count).
# AdamW with a cosine schedule and warm-up, so the moments, step counts and the rate all matter.
# Usage: check_train_zero.sh TRAIN MPIRUN   (without MPIRUN there is nothing to shard: skipped)
source "$(dirname "$0")/train_check_setup.sh"
failed=0
if [ -z "$mpirun" ]; then
  echo "note: no mpirun given: --zero shards across ranks, nothing to check"
  exit 0
fi

N=30
M=15
common=(--data synthetic --model mlp --samples 1280 --batch 64 --hidden 64 --progress lines --target 0
        --optimizer adamw --lr 0.003 --lr-schedule cosine --warmup-steps 5 --steps $N)
run() {  # ranks log args...
  local np=$1 log=$2
  shift 2
  if ! "$mpirun" -np "$np" --oversubscribe "$train" "${common[@]}" "$@" >"$log" 2>&1; then
    echo "FAIL: train at $np ranks $* failed:"
    sed 's/^/    /' "$log"
    failed=1
  fi
}

run 2 "$work/zero.log" --zero --save "$work/zero" --save-every $M
run 2 "$work/plain.log" --save "$work/plain"
grep -q "ZeRO-1 sharded optimizer state" "$work/zero.log" || { echo "FAIL: the --zero run does not say so"; failed=1; }
same_checkpoint "--zero vs without at 2 ranks" "$(ckpt "$work/zero" $N)" "$(ckpt "$work/plain" $N)"

run 2 "$work/resumed2.log" --zero --resume "$(ckpt "$work/zero" $M)" --save "$work/resumed2"
same_checkpoint "--zero resumed at 2 ranks from step $M" "$(ckpt "$work/zero" $N)" "$(ckpt "$work/resumed2" $N)"

for np in 1 4; do
  run $np "$work/z$np.log" --zero --resume "$(ckpt "$work/zero" $M)" --save "$work/z$np"
  run $np "$work/p$np.log" --resume "$(ckpt "$work/zero" $M)" --save "$work/p$np"
  if ! grep -q "saved at 2 ranks, resumed at $np" "$work/z$np.log"; then
    echo "FAIL: the run resumed at $np ranks does not say where in the epoch it resumed:"
    sed 's/^/    /' "$work/z$np.log"
    failed=1
  fi
  same_checkpoint "saved at 2 ranks with --zero, resumed at $np with and without it" \
    "$(ckpt "$work/z$np" $N)" "$(ckpt "$work/p$np" $N)"
done
exit $failed
