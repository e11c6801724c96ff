#!/usr/bin/env python3
"""Validates muon::plan (muon-plan) against measured runs of muon-train-gpt.

Runs the main job in every layout at 1, 2 and 4 ranks (Muon and AdamW runs
in each) and compares, per layout and rank count, what muon-plan predicts
with what the job measured:
  - bytes sent per training step by the most loaded rank, optimizer state
    bytes and parameter bytes per rank: exactly (the model mirrors
    muon::distributed::Group::bytes_sent and the layouts' bucketing);
  - the optimizer's time per step (the layout's step after the gradients
    are reduced, which the job times apart): printed with the ratio
    predicted / measured, within 25% expected.

  bench/plan/validate_plan.py [--build build] [--machine FILE.json]
                              [--steps 30] [--ranks 1,2,4] [--bytes-only]

Without --machine it first runs `muon-plan calibrate`. Exits 1 when a byte
count differs (or, without --bytes-only, when a time is off by more than
--tolerance). Prints a Markdown table (docs/scale.md holds one).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# (label, muon-train-gpt flags, muon-plan layout)
JOBS = [
    ("single", ["--parallel", "single"], "replicated"),
    ("ddp replicated", ["--parallel", "ddp", "--optimizer-layout", "replicated"], "replicated"),
    ("ddp layerwise", ["--parallel", "ddp", "--optimizer-layout", "layerwise"], "layerwise"),
    ("sharded", ["--parallel", "sharded"], "sharded"),
    ("tp", ["--parallel", "tp"], "tp"),
    ("tp,sharded", ["--parallel", "tp,sharded", "--tp", "2"], "tp,sharded"),
]
# Collectives the job times outside the optimizer's step.
NOT_OPTIMIZER = ("gradients all-reduce", "gradients reduce-scatter", "activations all-reduce (TP)",
                 "step agreement")


# bench_distributed_layouts' rows and the layouts they time: the optimizer
# alone on the shards or replicas (no agreement, gradient reduction or row
# gathers: the prediction leaves those out).
BENCH = [("sharded owner-compute", "sharded"), ("sharded replicated", "sharded-replicated"),
         ("layer-wise", "layerwise")]
NOT_IN_BENCH = ("step agreement", "gradients all-reduce", "gradients reduce-scatter", "updated rows all-gather")


def bench_layouts(a, plan, machine):
    """The optimizer-step benchmark at 2 ranks against the model: time and MB sent per rank."""
    here = os.path.dirname(os.path.abspath(__file__))
    launch = os.path.join(a.build, "muon-launch")
    bench = os.path.join(a.build, "bench", "bench_distributed_layouts")
    out = subprocess.run([launch, "-n", "2", "--", bench], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True).stdout
    measured = {}
    for line in out.splitlines():
        line = line.split("] ", 1)[-1]
        for name, _ in BENCH:
            if line.startswith(name + " ") and len(line.split()) >= 4:
                nums = line[len(name):].split()
                measured[name] = (float(nums[0]), float(nums[2]))
    cmd = [plan, "--machine", machine, "--model", os.path.join(here, "bench_25m.json"), "--world", "2",
           "--ranks-per-node", "2", "--json"]
    predicted = {p["layout"]: p for p in json.loads(subprocess.check_output(cmd))}
    print("\n| bench_distributed_layouts (2 ranks) | MB sent/rank predicted | measured | ms/step predicted | "
          "measured | ratio |")
    print("|---|---|---|---|---|---|")
    bad = 0
    for name, layout in BENCH:
        if name not in measured:
            print(f"{name}: not in the benchmark's output", file=sys.stderr)
            bad += 1
            continue
        p = predicted[layout]
        kept = [c for c in p["collectives"] if c["what"] not in NOT_IN_BENCH]
        mb = sum(c["bytes"] for c in kept) / 1e6
        ms = 1e3 * (p["newton_schulz_s"] + p["elementwise_s"] + sum(c["seconds"] for c in kept))
        ms_meas, mb_meas = measured[name]
        ratio = ms / ms_meas
        ok_bytes = abs(mb - mb_meas) < 0.006  # the benchmark prints MB to 2 decimals
        ok_time = a.bytes_only or abs(ratio - 1) <= a.tolerance
        bad += (not ok_bytes) + (not ok_time)
        print(f"| {name} | {mb:.2f} | {mb_meas:.2f} | {ms:.1f} | {ms_meas:.1f} | {ratio:.2f}"
              f"{'' if ok_bytes else ' **bytes differ**'}{'' if ok_time else ' **time off**'} |")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--machine", default="")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--bytes-only", action="store_true", help="check bytes only (few steps are enough)")
    ap.add_argument("--tolerance", type=float, default=0.25)
    ap.add_argument("--out", default="", help="directory of the runs (default: a temporary one)")
    ap.add_argument("--no-bench", action="store_true", help="skip bench_distributed_layouts")
    a = ap.parse_args()
    plan = os.path.join(a.build, "muon-plan")
    job_bin = os.path.join(a.build, "examples", "train_gpt", "muon-train-gpt")
    out = a.out or tempfile.mkdtemp(prefix="validate-plan-")
    machine = a.machine
    if not machine:
        machine = os.path.join(out, "this.json")
        subprocess.run([plan, "calibrate", "--out", machine], check=True, stdout=subprocess.DEVNULL)
    ranks = [int(r) for r in a.ranks.split(",")]
    predicted = {}
    for adamw in (False, True):
        # Every rank of every job runs on this one machine.
        cmd = [plan, "--machine", machine, "--world", a.ranks, "--ranks-per-node", str(max(ranks)),
               "--json"] + (["--adamw"] if adamw else [])
        for p in json.loads(subprocess.check_output(cmd)):
            predicted[(p["layout"], p["world"], "adamw" if adamw else "muon")] = p
    rows, bad = [], 0
    for label, flags, layout in JOBS:
        for n in ranks:
            if (label == "single") != (n == 1) or (label == "tp,sharded" and n < 4):
                continue
            summary = os.path.join(out, f"{label.replace(' ', '-').replace(',', '-')}-{n}.json")
            cmd = [job_bin, "--nproc", str(n), "--runs", "muon,adamw", "--steps", str(a.steps),
                   "--eval-every", str(a.steps), "--out", os.path.join(out, "runs"), "--summary", summary,
                   "--no-plot", "--no-progress"] + flags
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                print(f"{label} at {n}: muon-train-gpt failed:\n{r.stdout[-2000:]}", file=sys.stderr)
                return 1
            for run in json.load(open(summary))["runs"]:
                p = predicted[(layout, n, run["name"])]
                opt_s = p["newton_schulz_s"] + p["elementwise_s"] + sum(
                    c["seconds"] for c in p["collectives"] if c["what"] not in NOT_OPTIMIZER)
                measured_ms = run["optimizer_ms_per_step"]
                ratio = 1e3 * opt_s / measured_ms if measured_ms > 0 else float("nan")
                same = (p["bytes_sent"] == run["bytes_sent_per_step"]
                        and p["state_bytes"] == run["optimizer_state_bytes"]
                        and p["parameter_bytes"] == run["parameter_bytes"])
                timed_ok = a.bytes_only or abs(ratio - 1) <= a.tolerance
                bad += (not same) + (not timed_ok)
                rows.append((label, n, run["name"], p["bytes_sent"], run["bytes_sent_per_step"],
                             p["state_bytes"], run["optimizer_state_bytes"], p["parameter_bytes"],
                             run["parameter_bytes"], 1e3 * opt_s, measured_ms, ratio, same, timed_ok))
    print("| layout | ranks | run | sent/step predicted | measured | state predicted | measured | params "
          "predicted | measured | opt ms predicted | measured | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mark = "" if r[12] else " **bytes differ**"
        mark += "" if r[13] else " **time off**"
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]} | {r[8]} | "
              f"{r[9]:.1f} | {r[10]:.1f} | {r[11]:.2f}{mark} |")
    if not a.no_bench:
        bad += bench_layouts(a, plan, machine)
    exact = sum(1 for r in rows if r[12])
    within = sum(1 for r in rows if abs(r[11] - 1) <= a.tolerance)
    print(f"\nbytes, state and parameters exact: {exact} of {len(rows)}; optimizer time within "
          f"{a.tolerance:.0%}: {within} of {len(rows)} (machine: {machine})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
