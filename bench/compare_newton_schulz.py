#!/usr/bin/python3
"""Compare muon::newton_schulz (through muon_ns_probe) with the plain PyTorch formula.

Run with the system Python (the one that has torch):

    /usr/bin/python3 bench/compare_newton_schulz.py --probe build/bench/muon_ns_probe

For each shape and compute dtype it builds one input exactly as the probe does
(torch.manual_seed(seed); g64 = torch.randn(shape, dtype=float64)), times the
plain formula in PyTorch (three GEMMs per step, normalization in the compute
dtype), runs the probe on the same case, and compares times, achieved GFLOP/s
and the relative Frobenius error of each against the same schedule evaluated
in fp64. Plain and ours alternate which goes first from one case to the next
so that neither always sees a warmer (or hotter) machine.

The target checks (from the issue) are printed as PASS/FAIL; the exit code is
0 whatever they say unless --strict is given. A probe crash or an input
mismatch (checksum) is an error: exit 1.
"""

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import torch

import isa_mask  # bench/isa_mask.py

# ---------------------------------------------------------------------------
# Coefficient sets, as in /work/shared/REFERENCE.md (and src/coefficients.cpp).
# schedule: "cycle" (step k uses entry k mod len) or "repeat_last"
# (step k uses entry min(k, len - 1)).

_SIMPLE = (3.4445, -4.7750, 2.0315)

# One row a set: name, schedule, safety, default steps, its (a, b, c) tuples.
_SETS = [
    ("simple", "repeat_last", 1.0, 5, [_SIMPLE]),
    ("quintic", "cycle", 1.0, 5, [
        (4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]),
    # The paper's 8-step set, as Emerging-Optimizers and Megatron-Core name it.
    ("polar_express", "repeat_last", 1.0, 8, [
        (8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
        (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
        (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)]),
    # The 5-step set of modded-nanogpt and nanochat (safety factor 1.02).
    ("polar_express_5", "repeat_last", 1.02, 5, [
        (8.156554524902461, -22.48329292557795, 15.878769915207462),
        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]),
    ("cans", "repeat_last", 1.0, 5, [
        (8.4703, -25.1081, 18.6293), (4.1828, -3.1087, 0.5806), (3.9619, -2.9541, 0.5630),
        (3.2866, -2.4647, 0.5074), (2.2737, -1.6447, 0.4162)]),
    ("aol", "cycle", 1.0, 4, [
        (4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169)]),
    ("deepseekv4", "repeat_last", 1.0, 10, [_SIMPLE] * 8 + [(2.0, -1.5, 0.5)] * 2),
    ("cubic", "repeat_last", 1.0, 5, [(1.5, -0.5, 0.0)]),
    # Emerging-Optimizers' relaxed cubic: c = 0, five tuples cycled.
    ("cubic5", "cycle", 1.0, 5, [
        (3.3656576, -3.3420992, 0.0), (2.5744352, -1.4957376, 0.0), (2.5368962, -1.4312570, 0.0),
        (2.4418906, -1.2764040, 0.0), (2.2230472, -0.9630650, 0.0)]),
]
COEFFICIENT_SETS = {
    name: dict(coefficients=coefficients, schedule=schedule, safety=safety, steps=steps)
    for name, schedule, safety, steps, coefficients in _SETS
}

EPS = 1e-7  # the library's default normalization epsilon (kDefaultNsEps)

DEFAULT_SHAPES = ["768x3072", "1024x4096", "2048x2048", "4096x1024", "8x512x2048"]
DEFAULT_DTYPES = ["fp32", "bf16"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Targets from the issue.
TARGET_FP32_GEOMEAN = 1.5
TARGET_FP32_SQUARE = 1.3  # 2048x2048 fp32 ratio
TARGET_BF16_GEOMEAN = 1.3


def schedule_of(name, steps):
    cs = COEFFICIENT_SETS[name]
    coeffs = cs["coefficients"]
    n = len(coeffs)
    out = []
    for k in range(steps):
        i = k % n if cs["schedule"] == "cycle" else min(k, n - 1)
        out.append(coeffs[i])
    return out


def parse_shape(text):
    dims = [int(p) for p in text.split("x")]
    if len(dims) not in (2, 3) or any(d < 1 for d in dims):
        raise ValueError(f"bad shape {text!r}: want ROWSxCOLS or BATCHxROWSxCOLS")
    return dims


def plain_flops(shape, steps):
    """4·s²·l + 2·s³ per step per matrix (three plain GEMMs)."""
    rows, cols = shape[-2], shape[-1]
    batch = shape[0] if len(shape) == 3 else 1
    s, l = min(rows, cols), max(rows, cols)
    return float(steps) * (4.0 * s * s * l + 2.0 * s * s * s) * batch


def plain_ns(x, schedule, safety, eps=EPS):
    """The plain PyTorch formula, in x's dtype (normalization included)."""
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * safety + eps)
    for a, b, c in schedule:
        A = x @ x.mT
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    if tall:
        x = x.mT
    return x


def rel_err(y, ref):
    y = y.to(torch.float64)
    return ((y - ref).norm() / ref.norm()).item()


def median(v):
    return statistics.median(v)


def time_calls(fn, reps, warmup):
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, times


def gemm_peak(dtype, n=2048, reps=5, warmup=2):
    torch.manual_seed(0)
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    _, times = time_calls(lambda: a @ b, reps, warmup)
    return 2.0 * n ** 3 / median(times) * 1e-9


def blas_info():
    cfg = torch.__config__.show()
    found = re.findall(r"\b((?:BLAS|LAPACK)_INFO=[^,\s]*)", cfg)
    info = ", ".join(found) if found else "BLAS_INFO=?"
    loaded = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path)
                if any(k in base for k in ("blas", "mkl", "dnnl", "mkldnn")):
                    loaded.add(base)
    except OSError:
        pass
    return info, sorted(loaded)


def run_probe(probe, shape_text, dtype_name, args, steps):
    cmd = [
        probe,
        "--shape", shape_text,
        "--dtype", dtype_name,
        "--coefficients", args.coefficients,
        "--steps", str(steps),
        "--method", args.method,
        "--reps", str(args.reps),
        "--warmup", str(args.warmup),
        "--seed", str(args.seed),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"probe failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}"
        )
    lines = [l for l in proc.stdout.splitlines() if l.strip().startswith("{")]
    if not lines:
        raise RuntimeError(f"probe printed no JSON: {' '.join(cmd)}\n{proc.stdout}")
    return json.loads(lines[-1]), cmd


def fmt_err(v):
    return "nan" if v is None or not math.isfinite(v) else f"{v:.2e}"


def geomean(values):
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


COLUMNS = [
    ("shape", "shape", "{}"),
    ("dtype", "dtype", "{}"),
    ("method", "ours method", "{}"),
    ("plain_ms", "plain ms", "{:.1f}"),
    ("ours_ms", "ours ms", "{:.1f}"),
    ("ratio", "plain/ours", "{:.2f}"),
    ("plain_gflops", "plain GFLOP/s", "{:.0f}"),
    ("ours_gflops", "ours GFLOP/s", "{:.0f}"),
    ("plain_err", "err plain", None),
    ("ours_err", "err ours", None),
    ("err_ok", "err ours<=plain", None),
]


def row_cells(r):
    cells = []
    for key, _, fmt in COLUMNS:
        v = r.get(key)
        if key in ("plain_err", "ours_err"):
            cells.append(fmt_err(v))
        elif key == "err_ok":
            cells.append("PASS" if v else "FAIL")
        elif v is None:
            cells.append("-")
        else:
            cells.append(fmt.format(v))
    return cells


def print_table(rows, out=sys.stdout):
    headers = [h for _, h, _ in COLUMNS]
    body = [row_cells(r) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    print(line, file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for b in body:
        print("  ".join(c.rjust(w) for c, w in zip(b, widths)), file=out)


def markdown_table(rows):
    headers = [h for _, h, _ in COLUMNS]
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join(["---"] * 2 + ["---"] + ["---:"] * 7 + [":---:"]) + "|"]
    for r in rows:
        out.append("| " + " | ".join(row_cells(r)) + " |")
    return "\n".join(out)


def main():
    mask_note = isa_mask.follow()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probe", default="build/bench/muon_ns_probe",
                    help="path to the muon_ns_probe executable")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per case (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per case first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--coefficients", default="quintic", choices=sorted(COEFFICIENT_SETS))
    ap.add_argument("--steps", type=int, default=None, help="default: the set's")
    ap.add_argument("--method", default="auto", choices=["auto", "standard", "gram"],
                    help="method passed to the probe for ours")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                    help="comma-separated, e.g. 768x3072,8x512x2048")
    ap.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES), help="comma-separated: fp32,bf16")
    ap.add_argument("--json", metavar="PATH", help="write all rows and checks as JSON")
    ap.add_argument("--markdown", metavar="PATH", help="write a markdown table")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target check fails")
    args = ap.parse_args()

    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps must be >= 1 and --warmup >= 0")
    if not (os.path.isfile(args.probe) and os.access(args.probe, os.X_OK)):
        ap.error(f"probe {args.probe!r} is not an executable file (build target muon_ns_probe)")
    try:
        shapes = [(s, parse_shape(s)) for s in args.shapes.split(",") if s]
    except ValueError as e:
        ap.error(str(e))
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d!r}: choose from {', '.join(DTYPES)}")

    cs = COEFFICIENT_SETS[args.coefficients]
    steps = args.steps if args.steps is not None else cs["steps"]
    if not 1 <= steps < 100:
        ap.error("--steps must be in [1, 100)")
    schedule = schedule_of(args.coefficients, steps)
    safety = cs["safety"]

    info, loaded = blas_info()
    header = [
        f"torch {torch.__version__}  python {platform.python_version()}  "
        f"machine {platform.machine()}  cpus {os.cpu_count()}",
        f"torch.get_num_threads() = {torch.get_num_threads()}  "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        f"{info}  loaded: {', '.join(loaded) if loaded else '?'}",
        f"probe {args.probe}  coefficients {args.coefficients} x{steps} "
        f"(safety {safety}, eps {EPS})  method {args.method}  reps {args.reps} "
        f"(median)  warmup {args.warmup}  seed {args.seed}",
        "ISA mask: " + " ".join(f"{k}={os.environ[k]}" for k in
                                ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE")
                                if k in os.environ) + (f"  ({mask_note})" if mask_note else ""),
    ]
    for h in header:
        print(h)

    peak = {}
    for name in ("fp32", "bf16"):
        peak[name] = gemm_peak(DTYPES[name])
    print(f"GEMM peak (2048x2048 matmul, median of 5): fp32 {peak['fp32']:.0f} GFLOP/s, "
          f"bf16 {peak['bf16']:.0f} GFLOP/s")
    print(flush=True)

    rows = []
    errors = []
    case = 0
    for shape_text, shape in shapes:
        torch.manual_seed(args.seed)
        g64 = torch.randn(shape, dtype=torch.float64)
        checksum = g64.sum().item()
        ref = plain_ns(g64, schedule, safety)  # the schedule in fp64
        flops = plain_flops(shape, steps)
        for dname in dtypes:
            dt = DTYPES[dname]
            x = g64.to(dt)

            def plain():
                y, t = time_calls(lambda: plain_ns(x, schedule, safety), args.reps, args.warmup)
                return y, t

            def ours():
                return run_probe(args.probe, shape_text, dname, args, steps)

            row = dict(shape=shape_text, dtype=dname, coefficients=args.coefficients, steps=steps,
                       flops=flops, seed=args.seed, order="plain-first" if case % 2 == 0
                       else "ours-first")
            try:
                if case % 2 == 0:
                    y_plain, t_plain = plain()
                    probe, cmd = ours()
                else:
                    probe, cmd = ours()
                    y_plain, t_plain = plain()
            except RuntimeError as e:
                print(f"ERROR {shape_text} {dname}: {e}", file=sys.stderr, flush=True)
                errors.append(f"{shape_text} {dname}: {e}")
                case += 1
                continue
            case += 1

            if abs(probe["checksum"] - checksum) > 1e-9 * max(1.0, abs(checksum)):
                msg = (f"input mismatch for {shape_text}: probe checksum {probe['checksum']!r} "
                       f"vs python {checksum!r}")
                print("ERROR " + msg, file=sys.stderr)
                errors.append(msg)
                continue
            if probe["steps"] != steps or abs(probe["flops"] - flops) > 1e-6 * flops:
                msg = (f"probe schedule mismatch for {shape_text}: steps {probe['steps']} "
                       f"flops {probe['flops']} vs {steps}, {flops}")
                print("ERROR " + msg, file=sys.stderr)
                errors.append(msg)
                continue

            plain_s = median(t_plain)
            ours_s = probe["median_s"]
            row.update(
                method=probe["resolved"],
                kernels=probe.get("kernels", ""),
                plain_ms=plain_s * 1e3,
                ours_ms=ours_s * 1e3,
                ratio=plain_s / ours_s,
                plain_gflops=flops / plain_s * 1e-9,
                ours_gflops=flops / ours_s * 1e-9,
                plain_err=rel_err(y_plain, ref),
                ours_err=probe["rel_err"],
                plain_times_s=t_plain,
                ours_times_s=probe["times_s"],
                plain_min_ms=min(t_plain) * 1e3,
                ours_min_ms=probe["min_s"] * 1e3,
                probe_cmd=" ".join(cmd),
            )
            row["err_ok"] = (row["ours_err"] is not None and math.isfinite(row["plain_err"])
                             and row["ours_err"] <= row["plain_err"])
            rows.append(row)
            print(f"  {shape_text:>11} {dname}: plain {row['plain_ms']:.1f} ms, ours "
                  f"{row['ours_ms']:.1f} ms ({row['method']}), ratio {row['ratio']:.2f}",
                  flush=True)

    print()
    print_table(rows)
    print()

    # Summary and target checks.
    checks = []
    geo = {}
    for dname in dtypes:
        geo[dname] = geomean([r["ratio"] for r in rows if r["dtype"] == dname])
        print(f"geomean plain/ours {dname}: {geo[dname]:.3f}")

    def check(name, ok, detail):
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        checks.append(dict(check=name, status=status, detail=detail))

    full = [s for s, _ in shapes] == DEFAULT_SHAPES
    if "fp32" in dtypes:
        g = geo["fp32"]
        check(f"fp32 geomean >= {TARGET_FP32_GEOMEAN}",
              (g >= TARGET_FP32_GEOMEAN) if math.isfinite(g) else False,
              f"{g:.3f}" + ("" if full else " (subset of shapes)"))
        sq = [r for r in rows if r["dtype"] == "fp32" and r["shape"] == "2048x2048"]
        check(f"2048x2048 fp32 ratio >= {TARGET_FP32_SQUARE}",
              (sq[0]["ratio"] >= TARGET_FP32_SQUARE) if sq else None,
              f"{sq[0]['ratio']:.3f}" if sq else "not measured")
    else:
        check(f"fp32 geomean >= {TARGET_FP32_GEOMEAN}", None, "not measured")
        check(f"2048x2048 fp32 ratio >= {TARGET_FP32_SQUARE}", None, "not measured")
    if "bf16" in dtypes:
        g = geo["bf16"]
        check(f"bf16 geomean >= {TARGET_BF16_GEOMEAN}",
              (g >= TARGET_BF16_GEOMEAN) if math.isfinite(g) else False,
              f"{g:.3f}" + ("" if full else " (subset of shapes)"))
    else:
        check(f"bf16 geomean >= {TARGET_BF16_GEOMEAN}", None, "not measured")
    for r in rows:
        check(f"error ours <= plain {r['shape']} {r['dtype']}", r["err_ok"],
              f"{fmt_err(r['ours_err'])} vs {fmt_err(r['plain_err'])}")
    for e in errors:
        check("case ran", False, e.splitlines()[0])

    print()
    for c in checks:
        print(f"{c['status']:4}  {c['check']}: {c['detail']}")
    failed = [c for c in checks if c["status"] == "FAIL"]
    print(f"\n{len(checks) - len(failed)}/{len(checks)} checks passed or skipped")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=header, gemm_peak_gflops=peak, geomean=geo, rows=rows,
                           checks=checks, errors=errors), f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(f"<!-- {h} -->" for h in header) + "\n\n")
            f.write(f"GEMM peak (2048×2048 matmul): fp32 {peak['fp32']:.0f} GFLOP/s, "
                    f"bf16 {peak['bf16']:.0f} GFLOP/s; torch threads {torch.get_num_threads()}; "
                    f"{args.coefficients} ×{steps}, median of {args.reps}.\n\n")
            f.write(markdown_table(rows) + "\n\n")
            for dname in dtypes:
                f.write(f"Geometric mean of plain/ours, {dname}: {geo[dname]:.2f}\n\n")
            for c in checks:
                f.write(f"- {c['status']} {c['check']}: {c['detail']}\n")

    if errors:
        return 1
    if args.strict and failed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
