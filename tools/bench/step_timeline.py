#!/usr/bin/python3
"""Where a training step's time goes, from train's --trace files: medians per phase and rank.

  step_timeline.py TRACE [TRACE ...] [--skip N]

Each TRACE is a merged Chrome trace of `train --trace` (one process per rank). For every rank of
every file it prints the median over the steps (after the first N, default 20) of:

  step              the main thread's `step` span
  forward + loss    `forward + loss`
  backward          autograd's `backward` (with DDP: the gradient hooks, the bucket copies, the
                    polls that advance reductions, and `ddp finalize`)
  wait for buckets  `ddp wait for buckets` inside backward: communication backward did not hide
  optimizer step    `optimizer step`
  other             step - (forward + loss + backward + optimizer step): batch hand-off, zero_grad
  bucket i          each DDP bucket from its launch to its reduction (async span)
  last bucket tail  the last bucket's launch to the end of backward: what the step waits for
                    after the last gradient is ready

Put a 1-process trace beside a 2-rank one of the same model to see which phase grows. Standard
library only (json, statistics); any python3 runs it.
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict

PHASES = ["step", "forward + loss", "backward", "ddp wait for buckets", "optimizer step"]
LABELS = {"ddp wait for buckets": "wait for buckets"}


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def rank_rows(events, skip):
    """{rank: {row label: median ms}} for one trace."""
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
    by_pid = defaultdict(list)
    for e in events:
        by_pid[e.get("pid")].append(e)
    out = {}
    for pid, evs in sorted(by_pid.items(), key=lambda kv: (kv[0] is None, kv[0])):
        steps = sorted((e for e in evs if e.get("ph") == "X" and e.get("name") == "step"), key=lambda e: e["ts"])
        steps = steps[skip:]
        if not steps:
            continue
        spans = defaultdict(list)  # phase -> per-step total ms
        buckets = defaultdict(list)  # bucket name -> latencies (ms)
        tails = []
        xs = sorted((e for e in evs if e.get("ph") == "X"), key=lambda e: e["ts"])
        begins = {}
        asyncs = []  # (begin ts, end ts, name)
        for e in sorted((e for e in evs if e.get("ph") in ("b", "e")), key=lambda e: e["ts"]):
            key = (e.get("id"), e.get("name"))
            if e["ph"] == "b":
                begins[key] = e["ts"]
            elif key in begins:
                asyncs.append((begins.pop(key), e["ts"], e["name"]))
        for s in steps:
            t0, t1 = s["ts"], s["ts"] + s["dur"]
            inside = [e for e in xs if t0 <= e["ts"] and e["ts"] + e["dur"] <= t1 and e is not s]
            totals = defaultdict(float)
            for e in inside:
                if e["name"] in PHASES:
                    totals[e["name"]] += e["dur"] / 1e3
            totals["step"] = s["dur"] / 1e3
            for p in PHASES:
                spans[p].append(totals.get(p, 0.0))
            phases = ("forward + loss", "backward", "optimizer step")  # the wait is inside backward
            spans["other"].append(totals["step"] - sum(totals.get(p, 0.0) for p in phases))
            mine = [a for a in asyncs if t0 <= a[0] <= t1]
            for b, e, name in mine:
                buckets[name].append((e - b) / 1e3)
            backward = [e for e in inside if e["name"] == "backward"]
            if mine and backward:
                last = max(mine, key=lambda a: a[0])
                bw_end = backward[-1]["ts"] + backward[-1]["dur"]
                tails.append(max(0.0, (bw_end - last[0]) / 1e3))
        rows = {}
        for p in PHASES:
            rows[LABELS.get(p, p)] = statistics.median(spans[p])
        rows["other"] = statistics.median(spans["other"])
        for name in sorted(buckets):
            rows[name] = statistics.median(buckets[name])
        if tails:
            rows["last bucket tail"] = statistics.median(tails)
        out[names.get(pid, f"pid {pid}")] = (rows, len(steps))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--skip", type=int, default=20, help="steps to leave out first (warm-up)")
    args = ap.parse_args()
    columns = []  # (title, rows)
    for path in args.traces:
        try:
            ranks = rank_rows(load(path), args.skip)
        except (OSError, ValueError, KeyError) as err:
            print(f"step_timeline: cannot read {path}: {err}", file=sys.stderr)
            return 2
        if not ranks:
            print(f"step_timeline: {path} has no steps after the first {args.skip}", file=sys.stderr)
            return 2
        for rank, (rows, n) in ranks.items():
            columns.append((f"{path} {rank} ({n} steps)", rows))
    labels = []
    for _, rows in columns:
        for k in rows:
            if k not in labels:
                labels.append(k)
    print("| ms (median) | " + " | ".join(t for t, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for k in labels:
        cells = [f"{rows[k]:.3f}" if k in rows else "-" for _, rows in columns]
        print(f"| {k} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
