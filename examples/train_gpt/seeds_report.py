#!/usr/bin/env python3
"""Muon's (and other runs') steps and wall time to the baseline's final
validation loss over several seeds of muon-train-gpt, from its CSV logs.

    /usr/bin/python3 seeds_report.py OUT [BASELINE]

OUT holds one directory per seed (examples/train_gpt/seeds.sh writes
OUT/seed-<S>/<run>.csv); BASELINE is the run whose final loss is the target
of each seed (default adamw). For each run and seed: the step and the
training wall time at which its validation loss first reaches the
baseline's final loss of the same seed (linear between evaluations, as the
job's table does), as ratios to the baseline's own; then the mean and the
spread (min..max) over the seeds, the final loss, ms/step and the
optimizer's share of the step. Writes OUT/seeds.png: validation loss
against steps and against wall time, one line a run and seed.
"""
import csv
import glob
import os
import statistics
import sys


def read(path):
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rows.append((int(row["step"]), float(row["seconds"]), float(row["valid_loss"]),
                         float(row["optimizer_seconds"])))
    return rows


def reach(rows, target):
    """(step, seconds) at which the loss first reaches target, or None."""
    for i, (step, sec, loss, _) in enumerate(rows):
        if loss > target:
            continue
        if i == 0:
            return float(step), sec
        s0, t0, l0, _ = rows[i - 1]
        f = (l0 - target) / (l0 - loss)
        return s0 + f * (step - s0), t0 + f * (sec - t0)
    return None


def summarize(values):
    if not values:
        return "not reached"
    lo, hi = min(values), max(values)
    return f"{statistics.mean(values):.2f}x ({lo:.2f}..{hi:.2f})"


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    out = argv[1]
    baseline = argv[2] if len(argv) > 2 else "adamw"
    seeds = sorted(d for d in glob.glob(os.path.join(out, "seed-*")) if os.path.isdir(d))
    if not seeds:
        sys.exit(f"seeds_report: no {out}/seed-*/ directories")
    runs = sorted({os.path.splitext(os.path.basename(p))[0]
                   for s in seeds for p in glob.glob(os.path.join(s, "*.csv"))})
    runs = [r for r in runs if r != baseline] + [baseline]
    table = {r: {"steps": [], "time": [], "loss": [], "ms": [], "share": [], "missed": 0} for r in runs}
    logs = {}
    for seed in seeds:
        base = read(os.path.join(seed, baseline + ".csv"))
        target = base[-1][2]
        base_step, base_sec = reach(base, target)
        for run in runs:
            rows = read(os.path.join(seed, run + ".csv"))
            logs[(run, os.path.basename(seed))] = rows
            t = table[run]
            step, sec, loss, opt = rows[-1]
            t["loss"].append(loss)
            t["ms"].append(1000 * sec / step)
            t["share"].append(opt / sec)
            r = reach(rows, target)
            if r is None:
                t["missed"] += 1
                continue
            t["steps"].append(r[0] / base_step)
            t["time"].append(r[1] / base_sec)
    print(f"{len(seeds)} seeds; target: {baseline}'s final validation loss of each seed")
    print(f"{'run':<14} {'final val loss':>16} {'ms/step':>9} {'opt share':>9} "
          f"{'steps to target':>22} {'wall time to target':>22}")
    for run in runs:
        t = table[run]
        loss = f"{statistics.mean(t['loss']):.4f}±{statistics.pstdev(t['loss']):.4f}"
        steps = summarize(t["steps"]) + (f" ({t['missed']} missed)" if t["missed"] else "")
        print(f"{run:<14} {loss:>16} {statistics.mean(t['ms']):9.0f} "
              f"{100 * statistics.mean(t['share']):8.1f}% {steps:>22} {summarize(t['time']):>22}")
    plot(os.path.join(out, "seeds.png"), runs, logs)


def plot(path, runs, logs):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot: not written (needs matplotlib)")
        return
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (run, seed), rows in sorted(logs.items()):
        color = colors[runs.index(run) % len(colors)]
        label = run if seed.endswith("-1") else None
        by_step.plot([r[0] for r in rows], [r[2] for r in rows], color=color, alpha=0.8, label=label)
        by_time.plot([r[1] for r in rows], [r[2] for r in rows], color=color, alpha=0.8, label=label)
    by_step.set_xlabel("optimizer step")
    by_time.set_xlabel("training wall time (s)")
    for ax in (by_step, by_time):
        ax.set_ylabel("validation loss (nats/char)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("GPT 6x384 on the King James Bible: validation loss, every seed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main(sys.argv)
