"""One optimizer step over the matrices of a ~1B-parameter GPT on the GPU.

    PYTHONPATH=build-gpu/python python3 bench/gpu_muon_step.py --json step.json --markdown step.md
    PYTHONPATH=build/python python3 bench/gpu_muon_step.py --device cpu --quick   # a smoke test

The hidden matrices of a GPT of width d = 2048 and 20 blocks, each block
Wqkv 3d×d, Wo d×d, W1 4d×d, W2 d×4d: 12d² per block, 1.007 B parameters
(--width, --blocks change it). Parameters fp32 (--dtype bf16 for bf16
parameters and gradients), random gradients drawn once and kept, the same
initial values for every optimizer. Timed, one after the other with the
previous one's tensors freed:

- adamw:       torch.optim.AdamW(fused=True), lr 1e-3, weight_decay 0.1;
- torch_muon:  torch.optim.Muon (torch ≥ 2.9), lr 0.02, weight_decay 0.1, its
               defaults: (3.4445, -4.775, 2.0315) × 5 in bf16, one matrix at a time;
- ours:        muon_cpp.Muon, lr 0.02, weight_decay 0.1, the same iteration
               (coefficient_type "simple", 5 steps, ns_compute_dtype bfloat16,
               ns_eps_mode clamp as torch), scale_mode shape_scaling
               (torch's default adjust_lr "original");
- ours_ns:     Newton–Schulz alone of ours on the same matrices: one
               muon_cpp.newton_schulz call per shape on the stacked
               matrices (the batches muon_cpp.Muon forms), bf16.

Each: --warmup steps, then --steps steps each between torch.cuda.synchronize
calls (wall clock); the median. Reported: ours / (adamw + ours_ns) (goal
≤ 1.05: Muon's step costs its Newton–Schulz and little more than AdamW's
element-wise pass) and torch_muon / ours (goal > 1: ours faster).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_common as gc  # noqa: E402

NS = (3.4445, -4.775, 2.0315)


def shapes_of(width, blocks):
    d = width
    per_block = [("wqkv", (3 * d, d)), ("wo", (d, d)), ("w1", (4 * d, d)), ("w2", (d, 4 * d))]
    return [(f"blocks.{b}.{name}", shape) for b in range(blocks) for name, shape in per_block]


def make_tensors(shapes, device, dtype, seed):
    """Initial values and gradients, made on the device from one seed."""
    g = torch.Generator(device=device).manual_seed(seed)
    init = [torch.randn(s, device=device, dtype=dtype, generator=g).mul_(0.02) for _, s in shapes]
    grads = [torch.randn(s, device=device, dtype=dtype, generator=g) for _, s in shapes]
    return init, grads


def time_steps(step, device, warmup, steps):
    for _ in range(warmup):
        step()
    gc.sync(device)
    times = []
    for _ in range(steps):
        gc.sync(device)
        t = time.perf_counter()
        step()
        gc.sync(device)
        times.append(time.perf_counter() - t)
    return times


def bench_optimizer(name, make_opt, init, grads, device, args):
    params = [torch.nn.Parameter(p.clone()) for p in init]
    for p, g in zip(params, grads):
        p.grad = g.clone()  # the same gradient every step
    opt = make_opt(params)
    times = time_steps(opt.step, device, args.warmup, args.steps)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    finite = all(torch.isfinite(p).all().item() for p in params[:4])
    del opt, params
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return {"name": name, "median_s": gc.median(times), "times_s": times, "peak_gib": peak, "finite": finite}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a tiny model (width 64, 2 blocks), few steps")
    ap.add_argument("--width", type=int, help="model width d (default 2048; quick 64)")
    ap.add_argument("--blocks", type=int, help="transformer blocks (default 20; quick 2)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="parameters and gradients")
    ap.add_argument("--steps", type=int, help="timed steps (default 5; quick 3)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default 2; quick 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="comma-separated subset of adamw,torch_muon,ours,ours_ns")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    args = ap.parse_args()
    q = args.quick
    args.width = args.width or (64 if q else 2048)
    args.blocks = args.blocks or (2 if q else 20)
    args.steps = args.steps or (3 if q else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    device = gc.pick_device(args.device)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    only = set(args.only.split(",")) if args.only else {"adamw", "torch_muon", "ours", "ours_ns"}

    m, m_err = gc.import_muon_cpp()
    env = gc.environment(device, m, m_err)
    shapes = shapes_of(args.width, args.blocks)
    n_params = sum(r * c for _, (r, c) in shapes)
    init, grads = make_tensors(shapes, device, dtype, args.seed)

    results, notes = {}, []

    def run(name, fn):
        if name not in only:
            return
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001  (the row says it; the others still run)
            print(f"error in {name}: {type(e).__name__}: {e}", file=sys.stderr)
            results[name] = {"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            if device.type == "cuda":
                torch.cuda.empty_cache()

    run("adamw", lambda: bench_optimizer(
        "adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1,
                                              fused=device.type == "cuda"), init, grads, device, args))
    if hasattr(torch.optim, "Muon"):
        run("torch_muon", lambda: bench_optimizer(
            "torch_muon", lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.1), init, grads, device, args))
    else:
        notes.append(f"torch {torch.__version__} has no torch.optim.Muon")
    if m is not None:
        ours_opts = dict(coefficient_type="simple", num_ns_steps=5, ns_compute_dtype="bfloat16",
                         ns_eps_mode="clamp", scale_mode="shape_scaling", momentum=0.95, nesterov=True)
        run("ours", lambda: bench_optimizer(
            "ours", lambda ps: m.Muon(ps, lr=0.02, weight_decay=0.1, **ours_opts), init, grads, device, args))

        def ours_ns():
            groups = {}
            for (_, s), g in zip(shapes, grads):
                groups.setdefault(s, []).append(g)
            stacks = [torch.stack(gs).float() for gs in groups.values()]

            def step():
                for x in stacks:
                    m.newton_schulz(x, coefficients="simple", steps=5, compute_dtype=torch.bfloat16,
                                    method="auto", eps_mode="clamp")
            times = time_steps(step, device, args.warmup, args.steps)
            return {"name": "ours_ns", "median_s": gc.median(times), "times_s": times,
                    "batches": [list(x.shape) for x in stacks]}
        run("ours_ns", ours_ns)
    else:
        notes.append(f"muon_cpp not importable: {m_err}")

    med = {k: r.get("median_s") for k, r in results.items()}
    ratio = None
    if med.get("ours") and med.get("adamw") and med.get("ours_ns"):
        ratio = med["ours"] / (med["adamw"] + med["ours_ns"])
    speedup = med["torch_muon"] / med["ours"] if med.get("ours") and med.get("torch_muon") else None
    note = "quick mode: a tiny model, not meaningful" if q else ""
    goals = [gc.goal("ours / (adamw + ours_ns)", ratio, 1.05, "<=", note),
             gc.goal("torch_muon / ours (ours faster)", speedup, 1.0, ">=", note)]
    head = (f"device {env.get('gpu', env.get('cpu'))} ({device}); torch {env['torch']}; "
            f"{len(shapes)} matrices, {n_params / 1e6:,.1f} M parameters (width {args.width}, "
            f"{args.blocks} blocks), {args.dtype} parameters and gradients; median of {args.steps} steps "
            f"after {args.warmup}")
    rows = []
    for k in ("adamw", "torch_muon", "ours", "ours_ns"):
        r = results.get(k)
        if r is None:
            continue
        if "error" in r:
            rows.append([k, "error: " + r["error"][:100], "", ""])
        else:
            rows.append([k, r["median_s"] * 1e3, r.get("peak_gib"),
                         "" if r.get("finite", True) else "NON-FINITE"])
    md = head + "\n\n" + gc.md_table(["step", "ms", "peak GiB", "note"], rows)
    if notes:
        md += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    result = {"env": env, "args": vars(args), "parameters": n_params,
              "shapes": sorted({str(s) for _, s in shapes}), "results": results,
              "ours_over_adamw_plus_ns": ratio, "torch_muon_over_ours": speedup,
              "goals": goals, "notes": notes, "header": head}
    gc.finish(result, md, args)


if __name__ == "__main__":
    main()
