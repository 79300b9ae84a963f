#!/usr/bin/env bash
# train --model gpt (tools/train/train.cpp's GPT path) on a tiny model and a few KB of text the
# script writes, under mpirun -np 2 when MPIRUN is given (else a single process):
#   (a) a run with the recipe's optimizer writes a metrics file whose lines keep the schema with
#       val_loss exactly on the steps it evaluates (every --eval-every and the last), and its
#       "final:" line reports that validation loss; the default corpus (Debian's fortunes) trains too
#       when it is installed; tools/train/plot.py draws the file where matplotlib is;
#   (b) each seed mode alone and all of them together (--static-graph, --mixed-precision bf16,
#       --optimizer-in-backward, --delay-allreduce wte.weight; --clip-grad 0, which the optimizer in
#       backward requires) trains, DDP reports the mode, and the losses match a plain run's (the
#       f32 modes to 1e-6, bf16 to 0.02);
#   (c) --resume CKPT --sample-only --sample 40 --prompt "ab" prints the prompt and 40 characters
#       without training (nor reading the corpus), the same text twice and the same as the sample
#       the training run printed with that --seed, another text with another seed;
#   (d) bad input (a missing --text-file, an empty one, --clip-grad 1 with --optimizer-in-backward,
#       --n-embd not a multiple of --n-head) ends with a non-zero status and one error, the same on
#       every rank, before any step.
# Usage: check_train_gpt.sh TRAIN [MPIRUN]
source "$(dirname "$0")/train_check_setup.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
failed=0
fail() { echo "FAIL: $*"; failed=1; }
indent() { sed 's/^/    /' "$@"; }

# About 4 KB of lower-case words: a 28-byte vocabulary (29 ids with the unknown one), 10% of it
# (some 400 bytes) left for the validation windows of 16.
text="$work/text.txt"
"$py" - "$text" <<'EOF'
import random, sys
random.seed(28)
words = 'the quick brown fox jumps over a lazy dog and then runs back home to sleep'.split()
lines = [' '.join(random.choice(words) for _ in range(random.randint(4, 12))) for _ in range(110)]
open(sys.argv[1], 'w').write('\n'.join(lines) + '\n')
EOF
steps=10
every=5
tiny=(--model gpt --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch 4 --steps "$steps" --eval-every "$every"
      --eval-windows 16 --progress lines)

# Runs train under the launcher, stdout to $1.out and stderr to $1.err; prints nothing, returns its status.
run() {  # name args...
  local name=$1
  shift
  timeout -k 5 120 "${launch[@]}" "$train" "$@" >"$work/$name.out" 2>"$work/$name.err"
}
ran() {  # label name status: a failed run's report
  if [ "$3" -ne 0 ]; then
    fail "$1: train exited with status $3:"
    indent "$work/$2.out" "$work/$2.err"
    return 1
  fi
}

# The metrics file keeps the schema (the classifiers' keys less accuracy/test_loss, plus val_loss
# exactly on the evaluated steps), steps rise to the last, and the stdout's final line reports the
# last val_loss.
check_metrics() {  # label metrics.jsonl stdout
  "$py" - "$2" "$3" "$steps" "$every" <<'EOF' || { fail "$1: metrics or final line"; return 1; }
import json, math, re, sys
path, out, steps, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
always = ['step', 'epoch', 'loss', 'lr', 'samples_per_s', 'forward_ms', 'backward_ms', 'comm_ms', 'overlap_ms']
errors, rows = [], []
for n, line in enumerate(open(path), 1):
    r = json.loads(line)
    rows.append(r)
    missing = [k for k in always if k not in r]
    extra = [k for k in r if k not in always + ['val_loss']]
    if missing or extra:
        errors.append(f'line {n}: missing {missing}, unknown {extra}')
    for k, v in r.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            errors.append(f'line {n}: {k} is {v!r}, not a finite number')
got = [r.get('step') for r in rows]
if not got or got != sorted(set(got)) or got[-1] != steps:
    errors.append(f'steps {got}: not rising to {steps}')
evaluated = [r['step'] for r in rows if 'val_loss' in r]
want = sorted(set(range(every, steps + 1, every)) | {steps})
if evaluated != want:
    errors.append(f'val_loss on steps {evaluated}, want {want}')
if any(not 0 < r['val_loss'] < 10 for r in rows if 'val_loss' in r):
    errors.append('a val_loss outside (0, 10) nats per character')
final = [l for l in open(out) if l.startswith('final:')]
m = re.match(r'final: train loss [0-9.]+, validation loss ([0-9.]+) nats per character', final[-1]) if final else None
if not m:
    errors.append(f'no "final: ... validation loss ..." line: {final}')
elif rows and 'val_loss' in rows[-1] and abs(float(m.group(1)) - rows[-1]['val_loss']) > 6e-5:
    errors.append(f'final line says {m.group(1)}, the last val_loss is {rows[-1]["val_loss"]}')
for e in errors:
    print('   ', e)
sys.exit(1 if errors else 0)
EOF
}

# The sample a run printed: the text after its "sample (N characters, ...):" header, less the
# newline that ends it; fails unless it is printed once and is the prompt and N more characters.
sample_of() {  # stdout prompt chars
  "$py" - "$@" <<'EOF'
import sys
out, prompt, chars = open(sys.argv[1], 'rb').read(), sys.argv[2], int(sys.argv[3])
head = f'sample ({chars} characters, '.encode()
if out.count(b'\n' + head) + out.startswith(head) != 1:
    sys.exit(f'    {out.count(head)} sample headers')
text = out[out.index(head):].split(b'\n', 1)[1]
text = text[:-1] if text.endswith(b'\n') else text
s = text.decode()  # the ASCII corpus: one byte per character, the unknown id as U+FFFD
if not s.startswith(prompt) or len(s) != len(prompt) + chars:
    sys.exit(f'    {s!r} is not {prompt!r} and {chars} characters')
sys.stdout.write(s)
EOF
}

# (a) The recipe's optimizer (AdamW, warm-up + cosine, clipping at 1), with a checkpoint and a sample.
rc=0
run a "${tiny[@]}" --text-file "$text" --metrics "$work/a.jsonl" --save "$work/ckpt" --sample 40 --prompt ab \
  --seed 7 || rc=$?
if ran "recipe run" a $rc && check_metrics "recipe run" "$work/a.jsonl" "$work/a.out"; then
  echo "ok: the recipe's run logs val_loss at steps $every and $steps and reports it on its final line"
fi
trained_sample=$(sample_of "$work/a.out" ab 40) || fail "the training run's sample:"$'\n'"$trained_sample"

# The default corpus, where it is installed.
if [ -d /usr/share/games/fortunes ]; then
  rc=0
  run f "${tiny[@]}" --metrics "$work/f.jsonl" --sample 0 || rc=$?
  if ran "fortunes" f $rc && check_metrics "fortunes" "$work/f.jsonl" "$work/f.out"; then
    echo "ok: the default corpus (fortunes) trains"
  fi
else
  echo "note: no /usr/share/games/fortunes (tools/deps.sh installs it): the default corpus is not tried"
fi
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  if /usr/bin/python3 "$root/tools/train/plot.py" "$work/a.jsonl" -o "$work/a.png" >"$work/plot.log" 2>&1 &&
     [ "$(stat -c %s "$work/a.png")" -gt 10000 ]; then
    echo "ok: plot.py draws the GPT's metrics"
  else
    fail "plot.py on the GPT's metrics:"
    indent "$work/plot.log"
  fi
else
  echo "note: no matplotlib, plot.py is not tried on the GPT's metrics"
fi

# (b) The modes, alone and together, against a plain run with the schedule and clipping the
# optimizer in backward implies (constant lr, no warm-up, no clipping), spelled out.
loop=(--lr-schedule constant --warmup-steps 0 --clip-grad 0)
modes=(
  "plain|${loop[*]}|"
  "static|${loop[*]} --static-graph|static_graph"
  "bf16|${loop[*]} --mixed-precision bf16|mixed precision (param bf16"
  "inbackward|--optimizer-in-backward|optimizer in backward"
  "delay|${loop[*]} --delay-allreduce wte.weight|delayed allreduce of wte.weight"
  "all|--static-graph --mixed-precision bf16 --optimizer-in-backward --delay-allreduce wte.weight --clip-grad 0|static_graph; optimizer in backward; mixed precision (param bf16, reduce bf16, buffers as they are); delayed allreduce of wte.weight"
)
for m in "${modes[@]}"; do
  IFS='|' read -r name flags want <<<"$m"
  rc=0
  # shellcheck disable=SC2086  # the flags are words
  run "m_$name" "${tiny[@]}" --text-file "$text" --lr 0.01 --sample 0 $flags --metrics "$work/m_$name.jsonl" || rc=$?
  ran "mode $name ($flags)" "m_$name" $rc || continue
  check_metrics "mode $name" "$work/m_$name.jsonl" "$work/m_$name.out" || continue
  if [ -n "$want" ] && ! grep -qF -- "  modes: $want" "$work/m_$name.out"; then
    fail "mode $name: DDP does not report '$want':"
    indent "$work/m_$name.out"
    continue
  fi
  [ "$name" = plain ] && continue
  tol=1e-6
  [[ $flags == *bf16* ]] && tol=0.02
  if "$py" - "$work/m_plain.jsonl" "$work/m_$name.jsonl" "$tol" <<'EOF'; then
import json, sys
rows = lambda p: [json.loads(l) for l in open(p)]
a, b, tol = rows(sys.argv[1]), rows(sys.argv[2]), float(sys.argv[3])
bad = [(x['step'], k, x[k], y.get(k)) for x, y in zip(a, b) for k in ('loss', 'val_loss')
       if k in x and not abs(x[k] - y.get(k, float('inf'))) <= tol]
for s in bad:
    print('    step %d: %s %r, plain %r' % (s[0], s[1], s[3], s[2]))
sys.exit(1 if bad or len(a) != len(b) else 0)
EOF
    echo "ok: mode $name ($flags) trains, and its losses are the plain run's (within $tol)"
  else
    fail "mode $name ($flags): its losses are not the plain run's within $tol"
  fi
done

# (c) Sampling from the checkpoint of (a): no step, and no corpus (--text-file names no file).
ckpt="$work/ckpt/checkpoint-$(printf %08d $steps).safetensors"
sample_only() {  # name seed
  local rc=0
  run "$1" --resume "$ckpt" --sample-only --sample 40 --prompt ab --seed "$2" --text-file "$work/absent.txt" || rc=$?
  ran "--sample-only (seed $2)" "$1" $rc || return 1
  if grep -Eq '^(step |final:)' "$work/$1.out" || ! grep -q "^train: sampling from $ckpt" "$work/$1.out"; then
    fail "--sample-only trained, or did not say what it samples from:"
    indent "$work/$1.out"
    return 1
  fi
  sample_of "$work/$1.out" ab 40
}
if [ -f "$ckpt" ]; then
  s1='' s2='' s3=''
  if ! { s1=$(sample_only s1 7) && s2=$(sample_only s2 7) && s3=$(sample_only s3 8); }; then
    fail "--sample-only:"$'\n'"$s1$s2$s3"
  elif [ "$s1" != "$s2" ]; then
    fail "--sample-only gave two texts with --seed 7:"$'\n'"    $s1"$'\n'"    $s2"
  elif [ "$s1" != "$trained_sample" ]; then
    fail "--sample-only from the final checkpoint is not the sample the run printed with the same seed:"$'\n'"    $s1"$'\n'"    $trained_sample"
  elif [ "$s1" = "$s3" ]; then
    fail "--seed 7 and --seed 8 gave the same sample: $s1"
  else
    echo "ok: --sample-only prints the same ab + 40 characters twice with --seed 7 (those the run printed), others with --seed 8"
  fi
else
  fail "no checkpoint $ckpt"
fi

# (d) Bad input: a non-zero status, no step, and on stderr the one error (each rank may say it).
: >"$work/empty.txt"
bad() {  # label expected-message args...
  local label=$1 want=$2 rc=0
  shift 2
  run bad "$@" --sample 0 || rc=$?
  local errs
  errs=$(grep '^train' "$work/bad.err" | sed -E 's/^train \(rank [0-9]+\)/train/' | sort -u || true)
  if [ "$rc" -eq 0 ] || grep -q '^step ' "$work/bad.out" || [ "$(printf '%s\n' "$errs" | wc -l)" -ne 1 ] ||
     [[ $errs != *"$want"* ]] || grep -Eq 'terminate called|what\(\)|Aborted|core dumped' "$work/bad.err"; then
    fail "$label: status $rc; want one error with '$want':"
    indent "$work/bad.out" "$work/bad.err"
  else
    echo "ok: $label: status $rc, '$errs'"
  fi
}
shape=(--model gpt --n-layer 1 --block-size 16 --batch 4 --steps 2 --progress lines)
bad "a missing --text-file" "$work/absent.txt: no such file" \
  "${shape[@]}" --n-head 2 --n-embd 16 --text-file "$work/absent.txt"
bad "an empty --text-file" "$work/empty.txt: the file is empty" \
  "${shape[@]}" --n-head 2 --n-embd 16 --text-file "$work/empty.txt"
bad "--clip-grad 1 with --optimizer-in-backward" "--clip-grad needs the gradients before the step" \
  "${shape[@]}" --n-head 2 --n-embd 16 --text-file "$text" --optimizer-in-backward --clip-grad 1
bad "--n-embd 16 with --n-head 3" "n_embd 16 is not a multiple of n_head 3" \
  "${shape[@]}" --n-head 3 --n-embd 16 --text-file "$text"

[ -n "$mpirun" ] || echo "note: no mpirun given, the 2-rank case is not run"
exit $failed
