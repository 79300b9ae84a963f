#!/usr/bin/env bash
# tools/train/plot.py renders a PNG from a metrics file (tests/tools/metrics_example.jsonl, the schema
# `train --metrics` writes), and rejects a malformed one with one line. Exit 77 (CTest: skipped)
# without matplotlib.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$(mktemp -d)}
py=/usr/bin/python3
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP: matplotlib is missing (apt-get install python3-matplotlib)"
  exit 77
fi
"$py" "$root/tools/train/plot.py" "$root/tests/tools/metrics_example.jsonl" "$root/tests/tools/metrics_example.jsonl" \
  --labels first,second -o "$out/plot_test.png"
head -c 8 "$out/plot_test.png" | od -An -tx1 | tr -d ' \n' | grep -q '^89504e470d0a1a0a$' || { echo "not a PNG"; exit 1; }
[ "$(stat -c %s "$out/plot_test.png")" -gt 10000 ] || { echo "PNG suspiciously small"; exit 1; }
printf '{"step": 1}\n' > "$out/bad.jsonl"
if msg=$("$py" "$root/tools/train/plot.py" "$out/bad.jsonl" -o "$out/bad.png" 2>&1); then
  echo "a line without 'loss' was accepted"; exit 1
fi
echo "$msg" | grep -q "needs 'step' and 'loss'" || { echo "unexpected message: $msg"; exit 1; }
echo "ok: $out/plot_test.png"
