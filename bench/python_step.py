#!/usr/bin/python3
"""The 25M-parameter Muon step three ways: muon_cpp from Python, C++, plain Python.

The same step as `bench_optimizer_step --model 25m` (d = 512, 8 layers, per
layer 1536x512, 512x512, 2048x512, 512x2048: 32 matrices, 25,165,824 fp32
parameters; parameters N(0, 0.02^2) and gradients N(0, 1) drawn from seed 0
in the C++ order; lr 0.02, momentum 0.95 EMA with Nesterov, decoupled weight
decay 0.01, quintic coefficients x5, eps 1e-7, shape_scaling), timed three
ways in one run, interleaved round by round (A B C, A B C, ...):

  (a) python:  muon_cpp.Muon(...).step() called from Python (one C++ call per step);
  (b) C++:     muon::Muon::step() in `build/bench/bench_optimizer_step --model 25m
               --threads 1 --no-python` (a subprocess per round; its median of
               the round's timed steps, parsed from its table);
  (c) plain:   the plain PyTorch step of bench/muon_step_plain.py.

Each round of each way starts from fresh parameters and optimizer state: one
warm-up step (it allocates the momentum buffers), then --iters timed steps,
their median. The result of each way is the median of its round medians.
Every way runs with 1 thread (torch.set_num_threads(1), OPENBLAS_NUM_THREADS=1,
`--threads 1`), with fp32 and bf16 Newton-Schulz compute.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_step.py [--rounds 5] [--iters 3]

Prints each way's median per dtype, and the ratios python/C++ (target <= 1.05:
the Python layer adds at most 5% to the C++ step) and plain/python.
"""
import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import time

# One thread everywhere, set before torch (and OpenBLAS) load; the C++
# subprocess inherits it.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [(1536, 512), (512, 512), (2048, 512), (512, 2048)] * 8
DTYPES = {"fp32": ("float32", torch.float32), "bf16": ("bfloat16", torch.bfloat16)}
LR, MOMENTUM, WD, NS_STEPS, EPS = 0.02, 0.95, 0.01, 5, 1e-7


def import_muon_cpp():
    try:
        import muon_cpp
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "build", "python"))
        try:
            import muon_cpp
        except ImportError as e:
            raise SystemExit(f"python_step.py: cannot import muon_cpp ({e}); build it and set "
                             "PYTHONPATH=<build>/python") from e
    return muon_cpp


def import_plain():
    path = os.path.join(ROOT, "bench", "muon_step_plain.py")
    spec = importlib.util.spec_from_file_location("muon_step_plain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_model():
    """bench_optimizer_step's make_model: for each shape in order, the parameter
    N(0,1)*0.02 then its gradient N(0,1), from torch's CPU generator at seed 0
    (LibTorch's at::manual_seed(0) and at::randn: the same numbers)."""
    torch.manual_seed(0)
    params, grads = [], []
    for s in SHAPES:
        params.append(torch.randn(s) * 0.02)
        grads.append(torch.randn(s))
    return params, grads


def median(xs):
    return statistics.median(xs)


def timed(step, iters):
    """One warm-up call, then the median ms of `iters` calls."""
    step()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    return median(ms)


def round_python(muon_cpp, base, grads, dtype_name, iters):
    params = []
    for p, g in zip(base, grads):
        q = p.clone()
        q.grad = g
        params.append(q)
    opt = muon_cpp.Muon(params, lr=LR, weight_decay=WD, momentum=MOMENTUM, nesterov=True,
                        momentum_style="ema", weight_decay_mode="decoupled",
                        coefficient_type="quintic", num_ns_steps=NS_STEPS, ns_eps=EPS,
                        ns_compute_dtype=dtype_name, scale_mode="shape_scaling")
    return timed(opt.step, iters)


def round_plain(plain, base, grads, dtype, iters):
    params = [p.clone() for p in base]
    bufs = [torch.zeros_like(p) for p in params]
    return timed(lambda: plain.muon_step(params, grads, bufs, LR, MOMENTUM, WD, NS_STEPS, EPS,
                                         dtype), iters)


def round_cpp(exe, iters):
    """The C++ binary's medians for fp32 and bf16 (None when it cannot run)."""
    cmd = [exe, "--model", "25m", "--threads", "1", "--iters", str(iters), "--warmup", "1",
           "--no-python"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = {d: float(ms) for d, ms in re.findall(r"muon::Muon, NS (fp32|bf16)\s+([0-9.]+) ms", r.stdout)}
    if r.returncode != 0 or set(out) != set(DTYPES):
        raise SystemExit(f"python_step.py: `{' '.join(cmd)}` exited with {r.returncode} "
                         f"and printed no Muon step times:\n{r.stdout}{r.stderr}")
    return out


def check_same_step(muon_cpp, plain, base, grads):
    """One step of (a) and (c) from the same point: the updates must agree (the
    benchmark times the same work). Returns max|du_a - du_c| / max|du_c| per dtype."""
    out = {}
    for name, (dtype_name, dtype) in DTYPES.items():
        a = [p.clone() for p in base]
        for q, g in zip(a, grads):
            q.grad = g
        muon_cpp.Muon(a, lr=LR, weight_decay=WD, ns_compute_dtype=dtype_name).step()
        c = [p.clone() for p in base]
        plain.muon_step(c, grads, [torch.zeros_like(p) for p in c], LR, MOMENTUM, WD, NS_STEPS,
                        EPS, dtype)
        num = max(float((x - y).abs().max()) for x, y in zip(a, c))
        den = max(float((y - p).abs().max()) for y, p in zip(c, base))
        out[name] = num / den
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (A B C each)")
    parser.add_argument("--iters", type=int, default=3, help="timed steps per way and round")
    parser.add_argument("--cpp", default=os.path.join(ROOT, "build", "bench", "bench_optimizer_step"),
                        help="the C++ benchmark binary")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the check that (a) and (c) compute the same step")
    args = parser.parse_args()
    if args.rounds < 1 or args.iters < 1:
        parser.error("--rounds and --iters must be >= 1")
    if not os.access(args.cpp, os.X_OK):
        parser.error(f"--cpp {args.cpp}: not an executable (build bench_optimizer_step first)")
    torch.set_num_threads(1)
    muon_cpp = import_muon_cpp()
    plain = import_plain()
    base, grads = make_model()
    print(f"Muon step, model 25m: {sum(p.numel() for p in base)} parameters in {len(base)} "
          f"matrices, fp32; 1 thread; {args.rounds} interleaved rounds of 1 warm-up + "
          f"{args.iters} timed steps per way", flush=True)
    if not args.no_check:
        diff = check_same_step(muon_cpp, plain, base, grads)
        print("same step check, max|update python - update plain| / max|update plain|: " +
              ", ".join(f"NS {d} {v:.1e}" for d, v in diff.items()), flush=True)

    ms = {way: {d: [] for d in DTYPES} for way in ("python", "cpp", "plain")}
    with torch.no_grad():
        for r in range(args.rounds):
            for name, (dtype_name, _) in DTYPES.items():  # (a)
                ms["python"][name].append(round_python(muon_cpp, base, grads, dtype_name, args.iters))
            for name, value in round_cpp(args.cpp, args.iters).items():  # (b)
                ms["cpp"][name].append(value)
            for name, (_, dtype) in DTYPES.items():  # (c)
                ms["plain"][name].append(round_plain(plain, base, grads, dtype, args.iters))
            print(f"round {r + 1}/{args.rounds}: " + "; ".join(
                f"NS {d}: python {ms['python'][d][-1]:.1f}, C++ {ms['cpp'][d][-1]:.1f}, "
                f"plain {ms['plain'][d][-1]:.1f} ms" for d in DTYPES), flush=True)

    print()
    print("median of the round medians; 'paired' is the median of the per-round ratios")
    print(f"{'NS':<6}{'muon_cpp from Python':>22}{'C++ (bench)':>14}{'plain Python':>15}"
          f"{'python/C++':>13}{'paired':>9}{'plain/python':>14}{'paired':>9}")
    worst = 0.0
    for d in DTYPES:
        py, cpp, pl = (median(ms[w][d]) for w in ("python", "cpp", "plain"))
        paired_cpp = median([a / b for a, b in zip(ms["python"][d], ms["cpp"][d])])
        paired_plain = median([a / b for a, b in zip(ms["plain"][d], ms["python"][d])])
        worst = max(worst, paired_cpp)
        print(f"{d:<6}{py:>19.1f} ms{cpp:>11.1f} ms{pl:>12.1f} ms{py / cpp:>12.3f}x"
              f"{paired_cpp:>8.3f}x{pl / py:>13.2f}x{paired_plain:>8.2f}x")
    print(f"python/C++ (paired) worst {worst:.3f}x (target <= 1.05): "
          f"{'met' if worst <= 1.05 else 'NOT met'}")
    # What the Python layer adds per step regardless of the work: the same
    # 32-parameter step on 2x2 matrices (Python call, group and state hand-over,
    # engine dispatch, and the tiny arithmetic itself), an upper bound.
    tiny = []
    for _ in SHAPES:
        q = torch.randn(2, 2)
        q.grad = torch.randn(2, 2)
        tiny.append(q)
    opt = muon_cpp.Muon(tiny, lr=LR, weight_decay=WD)
    fixed = median([timed(opt.step, 20) for _ in range(5)])
    step = median(ms["python"]["fp32"] + ms["python"]["bf16"])
    print(f"fixed cost of a muon_cpp step of 32 parameters (2x2 each): {fixed:.3f} ms, "
          f"{100 * fixed / step:.3f}% of the 25m step")


if __name__ == "__main__":
    main()
