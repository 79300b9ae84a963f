#!/usr/bin/env bash
# Multi-node transport on one machine: train's DDP run under mpirun -np 4 with a hostfile, its ranks
# allowed to reach each other only over TCP (Open MPI's ob1 messaging with the tcp and self
# transports on the loopback interface, as ranks on separate nodes would), ends with bitwise the
# same parameters as the shared-memory run, in f32 and with bf16 mixed precision. Then, to show the
# restriction is real: the same run with only the self transport (no way to reach another rank)
# must fail, saying the ranks cannot reach each other.
# Usage: check_train_tcp.sh TRAIN MPIRUN
source "$(dirname "$0")/train_check_setup.sh"
[ -n "$mpirun" ] || { echo "usage: check_train_tcp.sh TRAIN MPIRUN"; exit 2; }
failed=0

hosts="$work/hosts"
echo "localhost slots=4" >"$hosts"
shm=("$mpirun" -np 4 --oversubscribe --hostfile "$hosts")
# What a cluster job sets (README, multi-node): the transports, and the interface the ranks use.
tcp=("${shm[@]}" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
common=(--data synthetic --model mlp --samples 1024 --batch 32 --hidden 64 --progress lines
        --target 0 --lr-schedule constant --optimizer adamw --lr 0.003)

ckpt() { printf '%s/checkpoint-%08d.safetensors' "$1" "$2"; }

run() {  # label dir extra-args... (the launcher in $launcher)
  local label=$1 dir=$2
  shift 2
  if ! timeout -k 5 180 "${launcher[@]}" "$train" "${common[@]}" --steps 12 "$@" --save "$dir" >"$dir.log" 2>&1; then
    echo "FAIL: $label: train failed:"
    sed 's/^/    /' "$dir.log" | tail -n 30
    failed=1
    return 1
  fi
}

for mode in f32 bf16; do
  extra=()
  [ "$mode" = bf16 ] && extra=(--mixed-precision bf16)
  launcher=("${shm[@]}")
  run "shared memory, $mode" "$work/shm-$mode" "${extra[@]}" || continue
  launcher=("${tcp[@]}")
  run "tcp only, $mode" "$work/tcp-$mode" "${extra[@]}" || continue
  a=$(ckpt "$work/shm-$mode" 12)
  b=$(ckpt "$work/tcp-$mode" 12)
  if [ -f "$a" ] && cmp -s "$a" "$b"; then
    echo "ok: $mode: 4 ranks over TCP end with the shared-memory run's parameters, bitwise"
  else
    echo "FAIL: $mode: the final checkpoints $a and $b differ (or are missing)"
    failed=1
  fi
done

# No transport between ranks: Open MPI must refuse, which shows the btl setting above is obeyed.
launcher=("${shm[@]}" --mca pml ob1 --mca btl self)
rc=0
timeout -k 5 120 "${launcher[@]}" "$train" "${common[@]}" --steps 1 >"$work/self.log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] && grep -qi "unable to reach each other" "$work/self.log"; then
  echo "ok: with only the self transport the job fails: the ranks cannot reach each other"
else
  echo "FAIL: the self-only run exited $rc without saying the ranks cannot reach each other:"
  sed 's/^/    /' "$work/self.log" | tail -n 20
  failed=1
fi
exit $failed
