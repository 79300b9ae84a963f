# The set-up the check_train_*.sh scripts share; each sources it after its usage comment.
# Sets train (the program, first argument) and mpirun (second, may be empty), py (the interpreter
# the checks parse JSON with), work (a scratch folder removed on exit), and launch / ranks: the
# 2-rank mpirun launcher when mpirun is given, else a plain single process; and the checkpoint
# helpers: ckpt (a run's file at a step), same_checkpoint (bitwise, naming the tensors that differ).
set -euo pipefail
train=${1:?usage: $(basename "$0") TRAIN [MPIRUN]}
mpirun=${2:-}
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
launch=(env)
ranks=1
if [ -n "$mpirun" ]; then
  launch=("$mpirun" -np 2 --oversubscribe)
  ranks=2
fi

# Names the tensors of two safetensors files that differ (stdlib only): the diagnosis when cmp fails.
diff_tensors() {
  "$py" - "$1" "$2" <<'EOF'
import json, struct, sys
def load(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop('__metadata__', None)
    return {k: data[v['data_offsets'][0]:v['data_offsets'][1]] for k, v in header.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
for k in sorted(set(a) | set(b)):
    if a.get(k) != b.get(k):
        print('    differs:', k)
EOF
}

same_checkpoint() {  # label file_a file_b
  if cmp -s "$2" "$3"; then
    echo "ok: $1: bitwise-identical final checkpoints"
  else
    echo "FAIL: $1: $2 and $3 differ"
    diff_tensors "$2" "$3" || true
    failed=1
  fi
}

ckpt() { printf '%s/checkpoint-%08d.safetensors' "$1" "$2"; }  # folder step: train's file name
