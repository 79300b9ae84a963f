#!/usr/bin/python3
"""Plots training runs from the metrics files `train --metrics FILE.jsonl` writes.

    tools/train/plot.py run1.jsonl [run2.jsonl ...] -o curves.png [--labels a,b]

Top panel: the training loss (left axis), the validation loss where it was evaluated (the GPT's
"val_loss", nats per character, on the same axis, dashed) and the test accuracy where it was
evaluated (right axis, dashed, when a run has one) against steps, one colour per run, runs
overlaid and labelled. Bottom panel: each run's time per logged step split into compute (forward +
backward) and communication not hidden behind backward (comm - overlap), as stacked areas. Each
line of a metrics file is one JSON object with at least "step" and "loss"; "val_loss",
"accuracy", "forward_ms", "backward_ms", "comm_ms" and "overlap_ms" are used where present. Needs matplotlib (Debian: python3-matplotlib); run with Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import sys


def read_run(path):
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot.py: {path}:{number}: not JSON ({e})")
            if "step" not in row or "loss" not in row:
                sys.exit(f"plot.py: {path}:{number}: a metrics line needs 'step' and 'loss'")
            rows.append(row)
    if not rows:
        sys.exit(f"plot.py: {path}: no metrics lines")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="metrics files (JSON lines)")
    ap.add_argument("-o", "--output", required=True, help="image to write (.png, .svg, .pdf)")
    ap.add_argument("--labels", help="comma-separated run labels (default: the file names)")
    args = ap.parse_args()
    labels = args.labels.split(",") if args.labels else [os.path.splitext(os.path.basename(f))[0] for f in args.files]
    if len(labels) != len(args.files):
        sys.exit(f"plot.py: {len(labels)} labels for {len(args.files)} files")
    runs = [read_run(f) for f in args.files]

    try:
        import matplotlib
    except ImportError:
        sys.exit("plot.py: matplotlib is missing (apt-get install python3-matplotlib; run with /usr/bin/python3)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    has_accuracy = any(r.get("accuracy") is not None for rows in runs for r in rows)
    acc_axis = top.twinx() if has_accuracy else None
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (rows, label) in enumerate(zip(runs, labels)):
        c = colours[k % len(colours)]
        steps = [r["step"] for r in rows]
        top.plot(steps, [r["loss"] for r in rows], color=c, label=f"{label} loss")
        validated = [r for r in rows if r.get("val_loss") is not None]
        if validated:
            top.plot([r["step"] for r in validated], [r["val_loss"] for r in validated], color=c, linestyle="--",
                     marker="s", markersize=3, label=f"{label} val loss")
        evaluated = [r for r in rows if r.get("accuracy") is not None]
        if evaluated:
            acc_axis.plot([r["step"] for r in evaluated], [100 * r["accuracy"] for r in evaluated], color=c,
                          linestyle="--", marker="o", markersize=3, label=f"{label} accuracy")
        if all("forward_ms" in r and "backward_ms" in r for r in rows):
            compute = [r["forward_ms"] + r["backward_ms"] for r in rows]
            exposed = [max(0.0, r.get("comm_ms", 0.0) - r.get("overlap_ms", 0.0)) for r in rows]
            bottom.plot(steps, compute, color=c, label=f"{label} compute (forward + backward)")
            bottom.plot(steps, [a + b for a, b in zip(compute, exposed)], color=c, linestyle=":",
                        label=f"{label} + communication not overlapped")
            bottom.fill_between(steps, compute, [a + b for a, b in zip(compute, exposed)], color=c, alpha=0.2)
    has_val = any(r.get("val_loss") is not None for rows in runs for r in rows)
    top.set_ylabel("loss (training, validation)" if has_val else "training loss")
    top.grid(alpha=0.3)
    lines = top.get_legend_handles_labels()
    if acc_axis is not None:
        acc_axis.set_ylabel("test accuracy (%)")
        more = acc_axis.get_legend_handles_labels()
        lines = (lines[0] + more[0], lines[1] + more[1])
    top.legend(lines[0], lines[1], fontsize="small", loc="center right" if acc_axis is not None else "upper right")
    bottom.set_xlabel("step")
    bottom.set_ylabel("time per step (ms)")
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize="small")
    else:
        bottom.text(0.5, 0.5, "no timings in these files", ha="center", va="center", transform=bottom.transAxes)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot.py: wrote {args.output}")


if __name__ == "__main__":
    main()
