#!/usr/bin/python3
"""The plain PyTorch Muon step, timed on the benchmark sets of bench_optimizer_step.

The baseline that bench_optimizer_step compares muon::Muon against: the
formula as the field writes it in Python (torch.optim.Muon's Newton–Schulz
with addmm, Keller Jordan's step order), one parameter at a time, with the
same shapes, schedule and hyper-parameters as the C++ benchmark:

  --model 25m: d = 512, 8 layers, per layer 1536×512, 512×512, 2048×512,
  512×2048 (32 matrices, 25,165,824 parameters, fp32); 64x128x128: 64
  matrices of 128×128; 32x256x1024: 32 of 256×1024; synthetic gradients;
  lr 0.02, momentum 0.95 (EMA) with Nesterov, decoupled weight decay 0.01,
  quintic coefficients ×5, eps 1e-7, scale sqrt(max(1, rows/cols)).

Run with the Python that has torch (/usr/bin/python3 here). Prints one line
per compute dtype:  plain_python_muon_step <dtype> median_ms <ms> runs <n>
"""
import argparse
import statistics
import time

import torch

import isa_mask  # bench/isa_mask.py
from compare_newton_schulz import COEFFICIENT_SETS

QUINTIC = COEFFICIENT_SETS["quintic"]["coefficients"]
MODELS = {
    "25m": [(1536, 512), (512, 512), (2048, 512), (512, 2048)] * 8,
    "64x128x128": [(128, 128)] * 64,
    "32x256x1024": [(256, 1024)] * 32,
}


def newton_schulz(grad, steps, eps, dtype):
    """Newton–Schulz on the short side, torch.optim.Muon's formulation."""
    x = grad.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + eps)
    for k in range(steps):
        a, b, c = QUINTIC[k % len(QUINTIC)]
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    if tall:
        x = x.T
    return x


@torch.no_grad()
def muon_step(params, grads, bufs, lr, momentum, wd, steps, eps, dtype):
    for p, g, buf in zip(params, grads, bufs):
        p.mul_(1 - lr * wd)
        buf.lerp_(g, 1 - momentum)
        update = g.lerp(buf, momentum)
        orth = newton_schulz(update, steps, eps, dtype)
        scale = max(1.0, p.size(0) / p.size(1)) ** 0.5
        p.add_(orth.to(p.dtype), alpha=-lr * scale)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument("--iters", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--dtype", choices=["bf16", "fp32", "both"], default="both")
    parser.add_argument("--ns-steps", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODELS), default="25m")
    args = parser.parse_args()
    isa_mask.follow()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen) * 0.02 for s in MODELS[args.model]]
    grads = [torch.randn(s, generator=gen) for s in MODELS[args.model]]
    dtypes = {"bf16": [torch.bfloat16], "fp32": [torch.float32],
              "both": [torch.float32, torch.bfloat16]}[args.dtype]
    for dtype in dtypes:
        bufs = [torch.zeros_like(p) for p in params]
        times = []
        for i in range(args.warmup + args.iters):
            start = time.perf_counter()
            muon_step(params, grads, bufs, 0.02, 0.95, 0.01, args.ns_steps, 1e-7, dtype)
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        name = "bf16" if dtype == torch.bfloat16 else "fp32"
        print(f"plain_python_muon_step {name} median_ms {statistics.median(times) * 1e3:.2f} "
              f"runs {len(times)} threads {torch.get_num_threads()}", flush=True)


if __name__ == "__main__":
    main()
