#!/usr/bin/env bash
# A run interrupted at a checkpoint and resumed ends with the same bits as an uninterrupted one
# (tools/train/train.cpp's promise): model, optimizer state (momentum, AdamW's moments and step), the LR
# schedule, the position and the RNG are all in the final checkpoint, so its whole file must be
# identical. Checked mid-epoch (the loader's prefetch thread then starts at that batch), in a
# single process and under mpirun -np 2, in two ways:
#   - stopped by --steps M, then resumed with --steps N (constant lr, SGD with momentum); the
#     metrics file the two parts append to must log what the uninterrupted run logs, step by step;
#   - resumed from the checkpoint an uninterrupted run wrote at step M (cosine schedule with
#     warm-up, AdamW), as after a crash; resuming that schedule with another run length is refused.
# Usage: check_train_resume.sh TRAIN [MPIRUN]   (without MPIRUN, the single process only)
source "$(dirname "$0")/train_check_setup.sh"
failed=0

# 1280 samples at batch 64: 20 batches per epoch alone, 10 per rank at 2 ranks; step 23 is batch 3
# of epoch 1 (alone) or of epoch 2 (2 ranks), and step 45 ends mid-epoch too.
N=45
M=23
common=(--data synthetic --model mlp --samples 1280 --batch 64 --hidden 64 --progress lines --target 0)

# The log lines of two metrics files at the steps both logged, less the timings: equal.
same_metrics() {  # label uninterrupted.jsonl resumed.jsonl
  if "$py" - "$2" "$3" <<'EOF'
import json, sys
timing = {'samples_per_s', 'forward_ms', 'backward_ms', 'comm_ms', 'overlap_ms'}
def rows(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        out[r['step']] = {k: v for k, v in r.items() if k not in timing}
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
common = sorted(set(a) & set(b))
bad = [s for s in common if a[s] != b[s]]
for s in bad:
    print(f'    step {s}: {a[s]} != {b[s]}')
# Both halves of the resumed file must be there: steps before and after the interruption.
sys.exit(1 if bad or len(common) < 8 or min(common) > 8 or max(common) != max(a) else 0)
EOF
  then
    echo "ok: $1: the resumed run's metrics match the uninterrupted run's"
  else
    echo "FAIL: $1: metrics differ (or too few common steps)"
    failed=1
  fi
}


run_case() {  # label launcher...
  local label=$1
  shift
  local launch=("$@") d="$work/$label"
  mkdir -p "$d"
  local log="$d/log"

  # Stopped by --steps M, resumed with --steps N.
  local a=(--lr-schedule constant --optimizer sgd --log-every 4)
  "${launch[@]}" "$train" "${common[@]}" "${a[@]}" --steps $N --save "$d/whole" --metrics "$d/whole.jsonl" >"$log" 2>&1
  "${launch[@]}" "$train" "${common[@]}" "${a[@]}" --steps $M --save "$d/parts" --metrics "$d/parts.jsonl" >"$log" 2>&1
  "${launch[@]}" "$train" "${common[@]}" "${a[@]}" --steps $N --resume "$d/parts" --save "$d/parts" \
    --metrics "$d/parts.jsonl" >"$log" 2>&1
  if ! grep -Eq "resumed from .*checkpoint-0*$M.safetensors at step $M \(epoch [0-9]+, batch [1-9][0-9]*\)" "$log"; then
    echo "FAIL: $label: the resumed run did not say it resumed mid-epoch at step $M:"
    sed 's/^/    /' "$log"
    failed=1
  fi
  same_checkpoint "$label, --steps $M then --resume" "$(ckpt "$d/whole" $N)" "$(ckpt "$d/parts" $N)"
  same_metrics "$label, --steps $M then --resume" "$d/whole.jsonl" "$d/parts.jsonl"

  # Resumed from an uninterrupted run's checkpoint at step M.
  local b=(--lr-schedule cosine --warmup-steps 5 --optimizer adamw --lr 0.003)
  "${launch[@]}" "$train" "${common[@]}" "${b[@]}" --steps $N --save "$d/crash" --save-every $M >"$log" 2>&1
  [ -f "$(ckpt "$d/crash" $M)" ] || { echo "FAIL: $label: no checkpoint at step $M"; failed=1; return; }
  "${launch[@]}" "$train" "${common[@]}" "${b[@]}" --steps $N --resume "$(ckpt "$d/crash" $M)" \
    --save "$d/after" >"$log" 2>&1
  same_checkpoint "$label, cosine + AdamW resumed from step $M" "$(ckpt "$d/crash" $N)" "$(ckpt "$d/after" $N)"

  # The same schedule resumed over another run length would follow another curve: refused.
  local rc=0
  "${launch[@]}" "$train" "${common[@]}" "${b[@]}" --steps 30 --resume "$(ckpt "$d/crash" $M)" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 2 ] || ! grep -q "was saved by a run of $N steps whose --lr-schedule cosine spans them; this run has 30 steps" "$log"; then
    echo "FAIL: $label: resuming the cosine schedule with --steps 30 gave status $rc:"
    sed 's/^/    /' "$log"
    failed=1
  else
    echo "ok: $label: a cosine schedule resumed with another run length is refused"
  fi
}

run_case single env
if [ -n "$mpirun" ]; then
  run_case np2 "$mpirun" -np 2 --oversubscribe
else
  echo "note: no mpirun given, the 2-rank case is not run"
fi
exit $failed
