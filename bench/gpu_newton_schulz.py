"""Newton–Schulz in bf16 on the GPU: muon_cpp against torch.optim.Muon's and Keller Jordan's.

    PYTHONPATH=build-gpu/python python3 bench/gpu_newton_schulz.py --json ns.json --markdown ns.md
    PYTHONPATH=build/python python3 bench/gpu_newton_schulz.py --device cpu --quick   # a smoke test

Three implementations of the same iteration, (a, b, c) = (3.4445, -4.7750,
2.0315) five times (muon_cpp's coefficient set "simple"), bf16 products, on
the same fp32 input (a Muon momentum buffer's dtype):

- ours:   muon_cpp.newton_schulz(x, coefficients="simple", steps=5,
          compute_dtype=torch.bfloat16, method="auto") (a batch in one call);
- torch:  torch.optim._muon._zeropower_via_newtonschulz(x, (a, b, c), 5, 1e-7),
          the function torch.optim.Muon calls, 2-D only: a batch is a loop
          over its matrices, as torch.optim.Muon steps its parameters;
- keller: zeropower_via_newtonschulz5 as Keller Jordan published it
          (bf16, X/(‖X‖+1e-7), transposed when rows > cols, A = X·Xᵀ,
          B = b·A + c·A·A, X = a·X + B·X), batched through @.

Timing: CUDA events around each call (perf_counter on the CPU), --warmup
calls of each first, then --reps rounds calling the three in a rotated
order; the median. The same run measures torch.mm's bf16 rate on
--gemm-n³ operands. TFLOP/s of ours = muon_cpp.newton_schulz_flops (the
FLOPs the method really performs, a symmetric product counted as the part
computed) × batch / time; plain TFLOP/s = the plain formula's FLOPs
(steps · (4s²l + 2s³) per matrix) / time, the same numerator for the three.
Accuracy: ‖y − ref‖_F / ‖ref‖_F and max |y − ref| against the same iteration
in fp64 (muon_cpp.newton_schulz(x.double(), compute_dtype=torch.float64) on
the same device; a plain torch fp64 loop where muon_cpp is missing).
Goals: ours ≥ 1.3× torch on the large shapes (4096², 8192×2048,
2048×8192), ≥ 1.5× on the tall and wide ones, ≥ 70% of the GEMM rate on
the large shapes, and error of ours ≤ torch's on every shape.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_common as gc  # noqa: E402

A, B, C = 3.4445, -4.7750, 2.0315
STEPS = 5
EPS = 1e-7
SET = "simple"  # muon_cpp's name of (3.4445, -4.775, 2.0315) repeated

# (label, role, shape): roles name the goals' shapes.
FULL_SHAPES = [("1024x1024", "square", (1024, 1024)),
               ("4096x4096", "large", (4096, 4096)),
               ("8192x2048", "tall", (8192, 2048)),
               ("2048x8192", "wide", (2048, 8192)),
               ("64x512x512", "batch", (64, 512, 512))]
QUICK_SHAPES = [("64x64", "square", (64, 64)),
                ("192x192", "large", (192, 192)),
                ("256x64", "tall", (256, 64)),
                ("64x256", "wide", (64, 256)),
                ("8x32x32", "batch", (8, 32, 32))]


def keller_zeropower_via_newtonschulz5(G, steps):
    """Keller Jordan's published Newton–Schulz (github.com/KellerJordan/Muon, muon.py)."""
    assert G.ndim >= 2
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    # Ensure spectral norm is at most 1
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    # Perform the NS iterations
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A  # quintic computation strategy adapted from suggestion by @jxbz, @leloykun, and @YouJiacheng
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def plain_fp64(x):
    """The same iteration in fp64 with plain torch ops (the reference without muon_cpp)."""
    X = x.double()
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + EPS)
    for _ in range(STEPS):
        Am = X @ X.mT
        X = A * X + (B * Am + C * Am @ Am) @ X
    return X.mT if tall else X


def torch_ns():
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz
        return _zeropower_via_newtonschulz, None
    except ImportError as e:
        return None, f"torch {torch.__version__} has no torch.optim._muon ({e})"


def plain_flops(rows, cols):
    s, l = min(rows, cols), max(rows, cols)
    return STEPS * (4.0 * s * s * l + 2.0 * s ** 3)


def our_flops(m, rows, cols, device):
    kw = dict(coefficients=SET, steps=STEPS, compute_dtype=torch.bfloat16, method="auto")
    try:
        return float(m.newton_schulz_flops(rows, cols, device=device.type, **kw))
    except TypeError:  # a build whose newton_schulz_flops takes no device
        return float(m.newton_schulz_flops(rows, cols, **kw))


def our_method(m, rows, cols, device):
    if not hasattr(m, "newton_schulz_method"):
        return None
    kw = dict(coefficients=SET, steps=STEPS, compute_dtype=torch.bfloat16, method="auto")
    try:
        return str(m.newton_schulz_method(rows, cols, device=device.type, **kw))
    except TypeError:
        try:
            return str(m.newton_schulz_method(rows, cols, **kw))
        except Exception:  # noqa: BLE001
            return None


def errors(y, ref):
    d = y.double() - ref
    return {"rel_fro": (d.norm() / ref.norm()).item(), "max_abs": d.abs().max().item()}


def run_shape(label, role, shape, device, m, tns, args):
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    x = torch.randn(shape, generator=g, dtype=torch.float32).to(device)
    rows, cols = shape[-2], shape[-1]
    batch = shape[0] if len(shape) == 3 else 1
    fns = {}
    if m is not None:
        fns["ours"] = lambda: m.newton_schulz(x, coefficients=SET, steps=STEPS,
                                              compute_dtype=torch.bfloat16, method="auto")
    if tns is not None:
        if batch == 1:
            fns["torch"] = lambda: tns(x, (A, B, C), STEPS, EPS)
        else:
            fns["torch"] = lambda: [tns(x[i], (A, B, C), STEPS, EPS) for i in range(batch)]
    fns["keller"] = lambda: keller_zeropower_via_newtonschulz5(x, STEPS)

    # Accuracy first (one call each), against fp64.
    if m is not None:
        ref = m.newton_schulz(x.double(), coefficients=SET, steps=STEPS, compute_dtype=torch.float64)
        ref_kind = "muon_cpp fp64"
    else:
        ref = plain_fp64(x)
        ref_kind = "plain torch fp64"
    outs = {}
    for name, fn in fns.items():
        y = fn()
        outs[name] = torch.stack(y) if isinstance(y, list) else y
    err = {name: errors(y, ref) for name, y in outs.items()}
    ref_check = (plain_fp64(x) - ref).norm().item() / ref.norm().item() if m is not None else None
    del outs, ref

    times = gc.time_round_robin(fns, device, args.warmup, args.reps)
    med = {k: gc.median(v) for k, v in times.items()}
    pf = plain_flops(rows, cols) * batch
    row = {"shape": label, "role": role, "dims": list(shape), "batch": batch,
           "median_s": med, "times_s": times, "errors": err, "reference": ref_kind,
           "reference_vs_plain_fp64": ref_check, "plain_flops": pf,
           "plain_tflops": {k: pf / v / 1e12 for k, v in med.items()}}
    if m is not None:
        of = our_flops(m, rows, cols, device) * batch
        row.update(our_flops=of, our_tflops=of / med["ours"] / 1e12,
                   our_method=our_method(m, rows, cols, device))
        row["our_fraction_of_gemm"] = row["our_tflops"] / args.gemm_tflops if args.gemm_tflops else None
        if "torch" in med:
            row["torch_over_ours"] = med["torch"] / med["ours"]
            row["err_ours_le_torch"] = err["ours"]["rel_fro"] <= err["torch"]["rel_fro"]
        row["keller_over_ours"] = med["keller"] / med["ours"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and few repetitions (a smoke test)")
    ap.add_argument("--shapes", help="comma-separated ROWSxCOLS or BATCHxROWSxCOLS (replaces the defaults)")
    ap.add_argument("--reps", type=int, help="timed rounds (default 20; quick 3)")
    ap.add_argument("--warmup", type=int, help="untimed calls of each first (default 5; quick 1)")
    ap.add_argument("--gemm-n", type=int, help="n of the n³ bf16 GEMM rate (default 8192; quick 256)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every row, the GEMM rate and the goals here")
    ap.add_argument("--markdown", help="write the tables here")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    args = ap.parse_args()
    q = args.quick
    args.reps = args.reps or (3 if q else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 5)
    args.gemm_n = args.gemm_n or (256 if q else 8192)
    device = gc.pick_device(args.device)
    if args.shapes:
        shapes = []
        for s in args.shapes.split(","):
            dims = tuple(int(v) for v in s.lower().split("x"))
            role = "batch" if len(dims) == 3 else ("tall" if dims[0] > dims[1] else
                                                   "wide" if dims[0] < dims[1] else "square")
            shapes.append((s, role, dims))
    else:
        shapes = QUICK_SHAPES if q else FULL_SHAPES

    m, m_err = gc.import_muon_cpp()
    tns, t_err = torch_ns()
    env = gc.environment(device, m, m_err)
    if m_err:
        print(f"warning: muon_cpp not importable, ours is left out: {m_err}", file=sys.stderr)
    if t_err:
        print(f"warning: {t_err}", file=sys.stderr)

    gemm = gc.gemm_tflops(device, args.gemm_n, torch.bfloat16, args.warmup, max(args.reps, 5))
    args.gemm_tflops = gemm["tflops"]
    rows = []
    for label, role, shape in shapes:
        try:
            rows.append(run_shape(label, role, shape, device, m, tns, args))
        except Exception as e:  # noqa: BLE001  (out of memory, or an error of one side: the row says it)
            print(f"error on {label}: {type(e).__name__}: {e}", file=sys.stderr)
            rows.append({"shape": label, "role": role, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    # The GEMM rate again at the end: the clocks may have moved.
    gemm_end = gc.gemm_tflops(device, args.gemm_n, torch.bfloat16, args.warmup, max(args.reps, 5))

    ok = [r for r in rows if "error" not in r]
    by_role = {r["role"]: r for r in ok}
    goals = []
    note = "quick mode: tiny shapes, not meaningful" if q else ""
    for role in ("large", "tall", "wide"):
        r = by_role.get(role)
        goals.append(gc.goal(f"torch/ours {r['shape'] if r else role} (large)",
                             r.get("torch_over_ours") if r else None, 1.3, ">=", note))
    for role in ("tall", "wide"):
        r = by_role.get(role)
        goals.append(gc.goal(f"torch/ours {r['shape'] if r else role} (tall/wide)",
                             r.get("torch_over_ours") if r else None, 1.5, ">=", note))
    for role in ("large", "tall", "wide"):
        r = by_role.get(role)
        goals.append(gc.goal(f"ours TFLOP/s / GEMM rate {r['shape'] if r else role}",
                             r.get("our_fraction_of_gemm") if r else None, 0.70, ">=", note))
    for r in ok:
        if "err_ours_le_torch" in r:
            goals.append({"goal": f"error ours <= torch {r['shape']}", "value": r["err_ours_le_torch"],
                          "target": "true", "status": "PASS" if r["err_ours_le_torch"] else "FAIL",
                          "note": f"{r['errors']['ours']['rel_fro']:.3e} vs {r['errors']['torch']['rel_fro']:.3e}"})

    head = (f"device {env.get('gpu', env.get('cpu'))} ({device}); torch {env['torch']} (CUDA {env['torch_cuda']}); "
            f"muon_cpp {'yes' if m else 'MISSING'}; bf16 GEMM {args.gemm_n}³: {gemm['tflops']:.1f} TFLOP/s "
            f"(start), {gemm_end['tflops']:.1f} (end); median of {args.reps} after {args.warmup} warm-up; "
            f"(a, b, c) = ({A}, {B}, {C}) × {STEPS}, fp32 input")
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["shape"], "error: " + r["error"][:80]] + [""] * 11)
            continue
        med = r["median_s"]
        ms = lambda k: med[k] * 1e3 if k in med else None  # noqa: E731
        e = lambda k: r["errors"][k]["rel_fro"] if k in r["errors"] else None  # noqa: E731
        table.append([r["shape"], r.get("our_method") or "–", ms("ours"), ms("torch"), ms("keller"),
                      r.get("torch_over_ours"), r.get("keller_over_ours"), r.get("our_tflops"),
                      r.get("our_fraction_of_gemm"), r["plain_tflops"].get("torch"),
                      e("ours"), e("torch"), e("keller")])
    md = head + "\n\n" + gc.md_table(
        ["shape", "ours method", "ours ms", "torch ms", "keller ms", "torch/ours", "keller/ours",
         "ours TFLOP/s", "of GEMM", "torch plain TFLOP/s", "err ours", "err torch", "err keller"], table)
    md += ("\nerr: ‖y − ref‖_F/‖ref‖_F against the fp64 iteration. torch on a batch: a loop over its "
           "matrices (its function is 2-D only, as torch.optim.Muon steps each parameter).\n\n")
    result = {"env": env, "args": {k: v for k, v in vars(args).items()}, "gemm": gemm, "gemm_end": gemm_end,
              "rows": rows, "goals": goals, "header": head}
    gc.finish(result, md, args)


if __name__ == "__main__":
    main()
