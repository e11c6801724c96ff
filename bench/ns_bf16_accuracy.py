#!/usr/bin/python3
"""bf16 Newton–Schulz accuracy: ours against Emerging-Optimizers' bf16 formula.

Run with the system Python (the one that has torch):

    /usr/bin/python3 bench/ns_bf16_accuracy.py --probe build/bench/muon_ns_probe
    /usr/bin/python3 bench/ns_bf16_accuracy.py --probe build/bench/muon_ns_probe \\
        --probe-before /path/to/older/build/bench/muon_ns_probe --markdown acc.md

For every coefficient set, shape, seed and method it builds the probe's input
(torch.manual_seed(seed); g64 = torch.randn(shape, dtype=float64);
x = g64.to(bfloat16)) and reports the relative Frobenius error against the
same schedule evaluated in fp64 on g64 of

- EO: Emerging-Optimizers' bf16 step, written out here with torch ops:
  X = bf16(x / max(‖x‖_F·safety, eps)) normalized in fp32, then per step
  A = X·Xᵀ, B = addmm(A, A, A, beta=b, alpha=c), X = addmm(X, B, X, beta=a),
  every product bf16 with fp32 accumulation and one rounding (LibTorch's CPU
  bf16 GEMMs);
- ours: muon::newton_schulz in bf16 through muon_ns_probe (--probe), and the
  same through a second probe (--probe-before, e.g. a build of an older
  tree) when given.

Errors are averaged over the seeds (the table also shows the largest ratio
ours/EO over the seeds). With --reps > 0 the probes are also timed on seed
0 of the first set, side by side: --rounds runs of --reps calls each,
alternating, and the best time per call of each (ms before, ms after,
before/after > 1: the current build is faster).

Exit code: 0, or 1 when a probe fails or reports another input (checksum).
"""

import argparse
import json
import math
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_newton_schulz import COEFFICIENT_SETS, EPS, parse_shape, schedule_of  # noqa: E402

DEFAULT_SHAPES = "128x128,512x512,1024x1024,256x1024,1024x256,512x2048,2048x512"
DEFAULT_SETS = "quintic,simple,polar_express"
# Names the probe accepts for each set, newest first (older builds named the
# 8-step set polar_express_8 and the 5-step one polar_express).
PROBE_NAMES = {"polar_express": ["polar_express_8", "polar_express"],
               "polar_express_5": ["polar_express_5", "polar_express"]}


def reference_fp64(g64, schedule, safety, eps=EPS):
    """The schedule in fp64 on the short side, normalized as the library does."""
    if g64.dim() == 3:
        return torch.stack([reference_fp64(g, schedule, safety, eps) for g in g64])
    x = g64.mT if g64.size(-2) > g64.size(-1) else g64
    x = x / (x.norm() * safety + eps)
    for a, b, c in schedule:
        A = x @ x.mT
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.mT if g64.size(-2) > g64.size(-1) else x


def eo_bf16(x16, schedule, safety, eps=EPS):
    """Emerging-Optimizers' bf16 iteration on the short side."""
    if x16.dim() == 3:
        return torch.stack([eo_bf16(x, schedule, safety, eps) for x in x16])
    tall = x16.size(-2) > x16.size(-1)
    x = x16.mT if tall else x16
    x32 = x.float()
    X = (x32 / torch.clamp(x32.norm() * safety, min=eps)).to(torch.bfloat16)
    for a, b, c in schedule:
        A = X @ X.mT
        B = torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.addmm(X, B, X, beta=a)
    return X.mT if tall else X


def rel_err(y, ref):
    y = y.to(torch.float64)
    return ((y - ref).norm() / ref.norm()).item()


def run_probe(probe, shape, name, steps, method, seed, reps):
    names = PROBE_NAMES.get(name, [name])
    last = None
    for probe_name in names:
        cmd = [probe, "--shape", shape, "--dtype", "bf16", "--coefficients", probe_name,
               "--steps", str(steps), "--method", method, "--seed", str(seed),
               "--reps", str(max(reps, 1)), "--warmup", "1" if reps > 0 else "0"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            line = [l for l in proc.stdout.splitlines() if l.startswith("{")][-1]
            return json.loads(line)
        last = f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr.strip()}"
    raise RuntimeError(f"probe failed: {last}")


def time_probes(probes, shape, name, steps, method, args):
    """Best time per call of each probe on seed 0 over --rounds runs of
    --reps calls each, the probes alternating (which goes first alternates
    too): the minimum is what a busy machine perturbs least."""
    best = {}
    for r in range(args.rounds):
        for tag, probe in (probes if r % 2 == 0 else probes[::-1]):
            out = run_probe(probe, shape, name, steps, method, 0, args.reps)
            best[tag] = min(best.get(tag, math.inf), out["min_s"])
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", required=True, help="muon_ns_probe of the build to measure")
    ap.add_argument("--probe-before", help="a second muon_ns_probe (e.g. an older tree)")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--sets", default=DEFAULT_SETS,
                    help=f"comma-separated, from: {', '.join(sorted(COEFFICIENT_SETS))}")
    ap.add_argument("--methods", default="standard,auto")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--reps", type=int, default=0,
                    help="timed calls per probe run, on the first set only (0: no timing)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing runs per probe")
    ap.add_argument("--markdown", help="also write the table as Markdown to this path")
    args = ap.parse_args()

    probes = [("after", args.probe)]
    if args.probe_before:
        probes.insert(0, ("before", args.probe_before))
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    case = 0
    for name in args.sets.split(","):
        cs = COEFFICIENT_SETS[name]
        steps = cs["steps"]
        schedule = schedule_of(name, steps)
        for shape in args.shapes.split(","):
            dims = parse_shape(shape)
            for method in args.methods.split(","):
                errs = {"eo": []}
                errs.update({tag: [] for tag, _ in probes})
                times = {}
                resolved = None
                for seed in seeds:
                    torch.manual_seed(seed)
                    g64 = torch.randn(dims, dtype=torch.float64)
                    ref = reference_fp64(g64, schedule, cs["safety"])
                    errs["eo"].append(rel_err(eo_bf16(g64.to(torch.bfloat16), schedule,
                                                      cs["safety"]), ref))
                    order = probes if case % 2 == 0 else probes[::-1]
                    case += 1
                    for tag, probe in order:
                        out = run_probe(probe, shape, name, steps, method, seed, 0)
                        if not math.isclose(out["checksum"], g64.sum().item(), rel_tol=1e-12,
                                            abs_tol=1e-9):
                            raise RuntimeError(f"{tag} probe built another input for {shape}")
                        if out["steps"] != steps:
                            raise RuntimeError(f"{tag} probe ran {out['steps']} steps of {name}")
                        errs[tag].append(out["rel_err"])
                        resolved = out["resolved"]
                if args.reps > 0 and name == args.sets.split(",")[0]:
                    times = time_probes(probes, shape, name, steps, method, args)
                mean = {k: sum(v) / len(v) for k, v in errs.items()}
                worst = max(a / e for a, e in zip(errs["after"], errs["eo"]))
                row = dict(set=name, shape=shape, method=f"{method}->{resolved}", eo=mean["eo"],
                           before=mean.get("before"), after=mean["after"],
                           after_eo=mean["after"] / mean["eo"], worst=worst,
                           t_before=times.get("before"), t_after=times.get("after"))
                rows.append(row)
                print(format_row(row), flush=True)
    md = markdown(rows)
    print()
    print(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md + "\n")
    return 0


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def format_row(r):
    ratio = (r["t_before"] / r["t_after"]) if r["t_before"] and r["t_after"] else None
    return (f"{r['set']:>13} {r['shape']:>10} {r['method']:>18}  EO {r['eo']:.2e}  "
            f"before {fmt(r['before'], '.2e')}  after {r['after']:.2e}  after/EO "
            f"{r['after_eo']:.3f} (worst seed {r['worst']:.3f})  ms before "
            f"{fmt(r['t_before'] and r['t_before'] * 1e3, '.2f')} after "
            f"{fmt(r['t_after'] and r['t_after'] * 1e3, '.2f')} before/after {fmt(ratio, '.3f')}")


def markdown(rows):
    out = ["| set | shape | method | EO bf16 | ours before | ours after | after/EO (worst seed) "
           "| ms before | ms after | before/after |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = (r["t_before"] / r["t_after"]) if r["t_before"] and r["t_after"] else None
        out.append(
            f"| {r['set']} | {r['shape']} | {r['method']} | {r['eo']:.2e} | "
            f"{fmt(r['before'], '.2e')} | {r['after']:.2e} | {r['after_eo']:.3f} "
            f"({r['worst']:.3f}) | {fmt(r['t_before'] and r['t_before'] * 1e3, '.2f')} | "
            f"{fmt(r['t_after'] and r['t_after'] * 1e3, '.2f')} | {fmt(ratio, '.3f')} |")
    return "\n".join(out)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        print(f"ns_bf16_accuracy: {e}", file=sys.stderr)
        sys.exit(1)
