#!/usr/bin/env python3
"""Plots validation loss against steps and against wall time for the CSV logs
written by muon-train-gpt (one file per run), into one PNG.

    /usr/bin/python3 plot_runs.py OUT.png RUN1.csv RUN2.csv ...
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    steps, seconds, loss = [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            steps.append(int(row["step"]))
            seconds.append(float(row["seconds"]))
            loss.append(float(row["valid_loss"]))
    return steps, seconds, loss


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out, paths = argv[1], argv[2:]
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    # Ten colors, then the same colors dashed and dotted: every run distinct.
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, path in enumerate(paths):
        name = os.path.splitext(os.path.basename(path))[0]
        steps, seconds, loss = read(path)
        style = dict(label=name, color=colors[i % len(colors)],
                     linestyle=("-", "--", ":")[(i // len(colors)) % 3])
        by_step.plot(steps, loss, **style)
        by_time.plot(seconds, loss, **style)
    by_step.set_xlabel("optimizer step")
    by_time.set_xlabel("training wall time (s)")
    for ax in (by_step, by_time):
        ax.set_ylabel("validation loss (nats/char)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small" if len(paths) > 6 else None)
    fig.suptitle("small GPT: validation loss")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv)
