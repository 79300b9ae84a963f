# The set-up the check_train_*.sh scripts share; each sources it after its usage comment.
# Sets train (the program, first argument) and mpirun (second, may be empty), py (the interpreter
# the checks parse JSON with), work (a scratch folder removed on exit), and launch / ranks: the
# 2-rank mpirun launcher when mpirun is given, else a plain single process.
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
