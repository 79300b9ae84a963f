#!/usr/bin/env bash
# train --metrics writes the schema tools/train/train.cpp documents and tools/train/plot.py reads: one JSON
# object per line with step, epoch, loss, lr, samples_per_s, forward_ms, backward_ms, comm_ms and
# overlap_ms (numbers); accuracy and test_loss exactly on the lines of steps that end an epoch or
# the run; steps rising; only rank 0 writes (under mpirun, when MPIRUN is given).
# Usage: check_train_metrics.sh TRAIN [MPIRUN]
source "$(dirname "$0")/train_check_setup.sh"
# 1280 samples at batch 64: 20 steps per epoch alone, 10 per rank at 2 ranks; the run stops 3
# steps into its third epoch, so the last line ends the run but no epoch.
per_epoch=$((1280 / 64 / ranks))
steps=$((2 * per_epoch + 3))
"${launch[@]}" "$train" --data synthetic --model mlp --samples 1280 --hidden 64 --progress lines --target 0 \
  --steps $steps --log-every 3 --metrics "$work/m.jsonl" >"$work/log" 2>&1 || {
  echo "FAIL: train exited with status $?:"
  sed 's/^/    /' "$work/log"
  exit 1
}
"$py" - "$work/m.jsonl" "$per_epoch" "$steps" <<'EOF'
import json, math, sys
path, per_epoch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
always = ['step', 'epoch', 'loss', 'lr', 'samples_per_s', 'forward_ms', 'backward_ms', 'comm_ms', 'overlap_ms']
evaluated = ['accuracy', 'test_loss']
errors = []
rows = []
for n, line in enumerate(open(path), 1):
    try:
        r = json.loads(line)
    except json.JSONDecodeError as e:
        errors.append(f'line {n} is not JSON ({e}): {line!r}')
        continue
    if not isinstance(r, dict):
        errors.append(f'line {n} is not an object')
        continue
    rows.append(r)
    missing = [k for k in always if k not in r]
    extra = [k for k in r if k not in always + evaluated]
    if missing or extra:
        errors.append(f'line {n}: missing {missing}, unknown {extra}')
        continue
    for k, v in r.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            errors.append(f'line {n}: {k} is {v!r}, not a finite number')
    if not isinstance(r['step'], int):
        errors.append(f'line {n}: step {r["step"]!r} is not an integer')
        continue
    s = r['step']
    ends = s % per_epoch == 0 or s == steps
    has = [k in r for k in evaluated]
    if ends and not all(has):
        errors.append(f'line {n}: step {s} ends an epoch or the run but has no accuracy/test_loss')
    if not ends and any(has):
        errors.append(f'line {n}: step {s} ends no epoch but has accuracy/test_loss')
    if ends and all(has) and not 0 <= r['accuracy'] <= 1:
        errors.append(f'line {n}: accuracy {r["accuracy"]} is outside [0, 1]')
    if abs(r['epoch'] - s / per_epoch) > 1e-9:
        errors.append(f'line {n}: epoch {r["epoch"]} at step {s} (want {s / per_epoch})')
got = [r['step'] for r in rows if isinstance(r.get('step'), int)]
want_ends = set(range(per_epoch, steps + 1, per_epoch)) | {steps}
if got != sorted(set(got)):
    errors.append(f'steps do not rise: {got}')
if not want_ends <= set(got):
    errors.append(f'steps {sorted(want_ends - set(got))} end an epoch or the run but were not logged')
if not any(s % 3 == 0 and s % per_epoch for s in got):
    errors.append(f'no --log-every 3 line between the epochs: {got}')
for e in errors:
    print('FAIL:', e)
if not errors:
    print(f'ok: {len(rows)} lines, evaluations at steps {sorted(want_ends)}')
sys.exit(1 if errors else 0)
EOF
