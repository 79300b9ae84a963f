#!/usr/bin/env bash
# Every tool rejects a bad flag or value with one line on stderr and exit status 2, and prints its
# usage with status 0 for --help. CTest runs this with the tools' directory (tools/CMakeLists.txt).
set -uo pipefail
dir=${1:?usage: check_bad_input.sh TOOLS_DIR}
failed=0

last_err=""  # expect_bad's last stderr, for expect_named
expect_bad() {  # tool args...
  local tool=$1
  shift
  last_err=""
  [ -x "$dir/$tool" ] || return 0  # not built in this configuration (bench_gpu without CUDA)
  local err rc lines
  err=$("$dir/$tool" "$@" 2>&1 >/dev/null)
  rc=$?
  last_err=$err
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ]; then
    echo "FAIL: $tool $* -> status $rc, $lines stderr lines (want 2 and 1):"
    printf '%s\n' "$err" | sed 's/^/    /'
    failed=1
  else
    echo "ok: $tool $* -> $err"
  fi
}

expect_help() {
  local tool=$1
  [ -x "$dir/$tool" ] || return 0
  if ! "$dir/$tool" --help >/dev/null 2>&1; then
    echo "FAIL: $tool --help does not exit 0"
    failed=1
  fi
}

for tool in train bench_cpu bench_ddp bench_gpu bench_train bench_allreduce flight_report; do
  expect_help "$tool"
  expect_bad "$tool" --no-such-flag
done
expect_bad flight_report /nonexistent/dir
expect_bad train --batch abc
expect_bad train --batch 0
expect_bad train --optimizer lbfgs
expect_bad train --mixed-precision f8
expect_bad train stray-argument
expect_bad bench_cpu --runs 0
expect_bad bench_ddp --runs -3
expect_bad bench_gpu --runs x
expect_bad bench_train --runs 0
expect_bad bench_train --worker nonsense
expect_bad bench_allreduce --backend gloo
expect_bad bench_allreduce --min-bytes 4Q
expect_bad bench_allreduce --dtype f8

# Files that are missing, empty of checkpoints or not what they claim: one error naming the file.
# expect_named checks the message names it, on top of expect_bad's one line and status 2.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
expect_named() {  # file tool args...
  local file=$1
  shift
  local before=$failed
  expect_bad "$@"
  [ -x "$dir/$1" ] || return 0
  if [ "$failed" = "$before" ] && [[ "$last_err" != *"$file"* ]]; then
    echo "FAIL: $* -> the message does not name $file"
    failed=1
  fi
}
echo "not a checkpoint" > "$scratch/checkpoint-3.safetensors"
mkdir "$scratch/empty"
# Every file of the set, the training images cut short.
for f in train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  printf '\x00\x00\x08\x01\x00\x00\x00\x01a' > "$scratch/$f"
done
printf '\x00\x00\x08\x01\x00\x00\x00\x05ab' > "$scratch/train-images-idx3-ubyte"
expect_named "$scratch/missing" train --resume "$scratch/missing"
expect_named "$scratch/empty" train --resume "$scratch/empty"
expect_named "$scratch/checkpoint-3.safetensors" train --resume "$scratch/checkpoint-3.safetensors"
expect_named "$scratch/checkpoint-3.safetensors" train --resume "$scratch"
expect_named "$scratch/empty" train --data fashion-mnist --data-root "$scratch/empty"
expect_named "$scratch/train-images-idx3-ubyte" train --data fashion-mnist --data-root "$scratch"
exit $failed
