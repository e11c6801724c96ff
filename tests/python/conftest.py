"""Shared setup and plain references for the muon_cpp Python tests.

`import muon_cpp` from a build tree: ctest sets PYTHONPATH=<build>/python;
by hand, either set PYTHONPATH the same way or MUON_CPP_PATH=<build>/python
(put first on sys.path here), e.g.

    MUON_CPP_PATH=build/python /usr/bin/python3 -m pytest tests/python

The reference functions below are written with plain torch ops, in fp64,
independently of the package: the Newton–Schulz textbook formula, the
documented step of each optimizer (include/muon/optim/*.h), the scale
factors (include/muon/scaling.h). The test modules import them with
`from conftest import ...` (pytest puts this directory on sys.path).
"""
import math
import os
import re
import sys

import pytest
import torch

_path = os.environ.get("MUON_CPP_PATH")
if _path:
    sys.path.insert(0, os.path.abspath(_path))


def _follow_isa_mask():
    """LibTorch's bf16 matmul under ONEDNN_MAX_CPU_ISA, as on such a CPU.

    scripts/test.sh runs these tests again with oneDNN masked below the
    CPU's level (AVX2: no bf16 matmul in oneDNN). torch decides from CPUID
    alone to send bf16 matmuls to oneDNN, which then throws; on a CPU that
    really lacks AVX-512 torch runs its own GEMM. The plain references
    below use torch's bf16 matmul, so under the mask they get what they get
    on such a CPU (tests/isa_mask.cpp does the same for the C++ tests).
    """
    if not (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")):
        return
    x = torch.ones(64, 64, dtype=torch.bfloat16)  # small products skip oneDNN
    try:
        x @ x
    except RuntimeError:
        torch.backends.mkldnn.enabled = False


_follow_isa_mask()

# ---- coefficient sets -----------------------------------------------------------

# What include/muon/newton_schulz.h documents for each built-in set besides
# its tuples (which the tests take from muon_cpp.coefficients(name)):
# (schedule, safety factor, default steps, number of tuples).
SET_FACTS = {
    "simple": ("repeat_last", 1.0, 5, 1),
    "quintic": ("cycle", 1.0, 5, 5),
    "polar_express": ("repeat_last", 1.0, 8, 8),
    "polar_express_5": ("repeat_last", 1.02, 5, 5),
    "cans": ("repeat_last", 1.0, 5, 5),
    "aol": ("cycle", 1.0, 4, 4),
    "deepseekv4": ("repeat_last", 1.0, 10, 10),
    "cubic": ("repeat_last", 1.0, 5, 1),
    "cubic5": ("cycle", 1.0, 5, 5),
}

# Unit roundoff of the compute dtypes.
U_FP32 = 2.0 ** -24
U_BF16 = 2.0 ** -8


def schedule_of(name, steps=None):
    """The (a, b, c) of every step of built-in set `name` (steps None: its default)."""
    import muon_cpp

    tuples = [tuple(float(v) for v in t) for t in muon_cpp.coefficients(name)]
    kind, _, default_steps, _ = SET_FACTS[name]
    n = default_steps if not steps else steps
    if kind == "cycle":
        return [tuples[k % len(tuples)] for k in range(n)]
    return [tuples[min(k, len(tuples) - 1)] for k in range(n)]


def safety_of(name):
    return SET_FACTS[name][1]


# ---- Newton–Schulz by the textbook formula ------------------------------------------


def ref_newton_schulz(g, schedule, eps=1e-7, safety=1.0, eps_mode="add", dtype=torch.float64):
    """X₀ = G/(‖G‖_F·safety + eps) (add) or G/max(‖G‖_F·safety, eps) (clamp), then
    per step (a, b, c): A = XXᵀ, X ← aX + (bA + cA²)X, on the short side (a tall
    matrix is transposed). Every product in `dtype`; for bf16 the normalization
    is formed in fp32 and rounded once (what the library documents). A 3-D
    input is a batch."""
    if g.dim() == 3:
        return torch.stack([ref_newton_schulz(m, schedule, eps, safety, eps_mode, dtype) for m in g])
    norm_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    x = g.to(norm_dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.t()
    n = x.norm() * safety
    x = x / (n + eps) if eps_mode == "add" else x / torch.clamp(n, min=eps)
    x = x.to(dtype)
    for a, b, c in schedule:
        A = x @ x.t()
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.t() if tall else x


def plain_error_over_orders(g, schedule, ref, safety=1.0, dtype=torch.float32, orders=8, seed=0):
    """The largest relative error against `ref` of the textbook formula in
    `dtype` over `orders` equally valid summation orders of the same input.

    Permuting rows and columns changes nothing but the order of the sums:
    NS(P·G·Q) = P·NS(G)·Q exactly for permutations P, Q. On small inputs
    (24×24) the plain formula's error moves by up to ~2× with that order
    alone, so one evaluation is no yardstick for a kernel that sums in
    another order (SYRK, K in chunks); the largest over several is.
    The first order is the identity."""
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for k in range(orders):
        rows = torch.arange(g.shape[-2]) if k == 0 else torch.randperm(g.shape[-2], generator=gen)
        cols = torch.arange(g.shape[-1]) if k == 0 else torch.randperm(g.shape[-1], generator=gen)
        out = ref_newton_schulz(g[..., rows, :][..., :, cols], schedule, safety=safety, dtype=dtype)
        back = torch.empty_like(out)
        back[..., rows[:, None], cols[None, :]] = out
        worst = max(worst, rel_err(back, ref))
    return worst


def rel_err(y, ref):
    y = y.to(torch.float64)
    ref = ref.to(torch.float64)
    return ((y - ref).norm() / ref.norm().clamp(min=1e-300)).item()


def with_spectrum(m, n, lo, seed):
    """An m×n fp64 matrix with singular values log-spaced in [lo, 1]."""
    gen = torch.Generator().manual_seed(seed)
    k = min(m, n)
    u, _ = torch.linalg.qr(torch.randn(m, k, dtype=torch.float64, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(n, k, dtype=torch.float64, generator=gen))
    s = torch.logspace(math.log10(lo), 0.0, k, dtype=torch.float64)
    return (u * s) @ v.t()


# ---- scale factors ------------------------------------------------------------------


def plain_scale(rows, cols, mode, extra=1.0):
    r, c = float(rows), float(cols)
    if mode == "shape_scaling":
        f = math.sqrt(max(1.0, r / c))
    elif mode == "spectral":
        f = math.sqrt(max(r, c))
    elif mode == "unit_rms_norm":
        f = math.sqrt(r / c)
    elif mode == "match_rms_adamw":
        f = 0.2 * math.sqrt(max(r, c))
    else:
        raise AssertionError(mode)
    return f * extra


# ---- the Muon step ---------------------------------------------------------------------

# muon::MuonOptions' defaults, under the Python option names.
MUON_DEFAULTS = dict(
    lr=0.02,
    weight_decay=0.0,
    momentum=0.95,
    nesterov=True,
    momentum_style="ema",
    weight_decay_mode="decoupled",
    coefficient_type="quintic",
    num_ns_steps=0,
    ns_eps=1e-7,
    ns_eps_mode="add",
    scale_mode="shape_scaling",
    extra_scale_factor=1.0,
    stacked_experts=False,
    split_qkv=False,
    qkv_split_sizes=[],
    num_query_groups=1,
)


def _opts(o):
    out = dict(MUON_DEFAULTS)
    out.update(o)
    return out


def ref_orthogonalize(u, o, scale=True):
    """Newton–Schulz of one matrix u (fp64) with the options `o`, scaled (or
    not), per fused-QKV block when split: block i gathers from every query
    group g the rows g·sum(split) + offset_i + [0, split_i)."""
    o = _opts(o)
    sched = schedule_of(o["coefficient_type"], o["num_ns_steps"])
    safety = safety_of(o["coefficient_type"])

    def ns(m):
        return ref_newton_schulz(m, sched, o["ns_eps"], safety, o["ns_eps_mode"])

    rows, cols = u.shape
    if not (o["split_qkv"] and o["qkv_split_sizes"]):
        f = plain_scale(rows, cols, o["scale_mode"], o["extra_scale_factor"]) if scale else 1.0
        return ns(u) * f
    split = list(o["qkv_split_sizes"])
    total = sum(split)
    out = torch.zeros_like(u)
    offset = 0
    for s in split:
        idx = torch.tensor([g * total + offset + r for g in range(o["num_query_groups"]) for r in range(s)])
        block = u.index_select(0, idx)
        f = plain_scale(block.shape[0], cols, o["scale_mode"], o["extra_scale_factor"]) if scale else 1.0
        out.index_copy_(0, idx, ns(block) * f)
        offset += s
    return out


class RefParam:
    """A parameter of the reference: value, momentum buffer and (adaptive) second moment, fp64."""

    def __init__(self, p):
        self.p = p.detach().to(torch.float64).clone()
        self.buf = None
        self.v = None


def ref_decay_and_momentum(s, g, o):
    """Steps 1–3 of include/muon/optim/muon.h; returns u."""
    o = _opts(o)
    g = g.to(torch.float64)
    lr, wd, mu = o["lr"], o["weight_decay"], o["momentum"]
    if s.buf is None:
        s.buf = torch.zeros_like(s.p)
    mode = o["weight_decay_mode"]
    if wd != 0:
        if mode == "decoupled":
            s.p = s.p * (1 - lr * wd)
        elif mode == "independent":
            s.p = s.p * (1 - wd)
        elif mode == "palm":
            s.p = s.p * (1 - lr * lr * wd)
        elif mode == "l2":
            g = g + wd * s.p
        else:
            raise AssertionError(mode)
    ema = o["momentum_style"] == "ema"
    s.buf = mu * s.buf + (1 - mu) * g if ema else mu * s.buf + g
    if not o["nesterov"]:
        return s.buf
    return (1 - mu) * g + mu * s.buf if ema else g + mu * s.buf


def ref_muon_step(s, g, o):
    """One muon::Muon step of RefParam `s` on gradient `g` with options `o`."""
    o = _opts(o)
    u = ref_decay_and_momentum(s, g, o)
    if o["stacked_experts"] and u.dim() >= 3:
        orth = torch.stack([ref_orthogonalize(u[e].reshape(u.shape[1], -1), o) for e in range(u.shape[0])])
    else:
        orth = ref_orthogonalize(u.reshape(u.shape[0], -1), o)
    s.p = s.p - o["lr"] * orth.reshape(s.p.shape)


def ref_adaptive_step(s, g, o, mode, beta2, eps):
    """One muon::AdaptiveMuon step (include/muon/optim/adaptive_muon.h)."""
    o = _opts(o)
    u = ref_decay_and_momentum(s, g, o)
    m = u.reshape(u.shape[0], -1)
    rows, cols = m.shape
    O = ref_orthogonalize(m, o, scale=False)
    if mode == "normuon":
        row_mean = (O * O).sum(1, keepdim=True) / cols
        s.v = (1 - beta2) * row_mean if s.v is None else beta2 * s.v + (1 - beta2) * row_mean
        n = O / (s.v.sqrt() + eps)
        n = n * (O.norm() / torch.clamp(n.norm(), min=eps))
        update = n * plain_scale(rows, cols, o["scale_mode"], o["extra_scale_factor"])
    elif mode == "namo":
        # Emerging-Optimizers' adaptive_muon.py, moment2_method "namo": v is the EMA of the raw
        # gradient's squared norm (kept as rows × 1 copies), the update O·‖u‖/(√v + ε)·scale.
        v_prev = torch.zeros(rows, 1, dtype=torch.float64) if s.v is None else s.v
        s.v = beta2 * v_prev + (1 - beta2) * (g.to(torch.float64) ** 2).sum()
        alpha = m.norm() / (s.v[0, 0].sqrt() + eps)
        update = O * alpha * plain_scale(rows, cols, o["scale_mode"], o["extra_scale_factor"])
    else:
        s.v = (1 - beta2) * O * O if s.v is None else beta2 * s.v + (1 - beta2) * O * O
        n = O / (s.v.sqrt() + eps)
        update = n * (0.2 * math.sqrt(rows * cols) / torch.clamp(n.norm(), min=eps)) * o["extra_scale_factor"]
    s.p = s.p - o["lr"] * update.reshape(s.p.shape)


def ref_lion_step(s, g, lr, beta1, beta2, wd):
    """Lion (Chen et al. 2023): u = sign(β1·m + (1 − β1)·g); p ← p·(1 − lr·wd) − lr·u;
    m ← β2·m + (1 − β2)·g."""
    g = g.to(torch.float64)
    if s.buf is None:
        s.buf = torch.zeros_like(s.p)
    u = torch.sign(beta1 * s.buf + (1 - beta1) * g)
    s.p = s.p * (1 - lr * wd) - lr * u
    s.buf = beta2 * s.buf + (1 - beta2) * g


def max_diff(a, b):
    return (a.detach().to(torch.float64) - b.detach().to(torch.float64)).abs().max().item()


# fp32 against an fp64 reference over 5 steps, relative to the largest value
# of the tensor (each test file says why its arithmetic stays within it).
FP32_STEP_TOL = 1e-5


def leaf(t):
    """A fresh leaf tensor with t's values that requires grad."""
    return t.detach().clone().requires_grad_(True)


def seeded_params(shapes, seed=0):
    """(generator, [(name, leaf)], {name: RefParam}) for `shapes` ({name: shape})."""
    gen = torch.Generator().manual_seed(seed)
    named = [(n, leaf(torch.randn(*s, generator=gen))) for n, s in shapes.items()]
    return gen, named, {n: RefParam(p) for n, p in named}


def within_fp32_steps(t, ref):
    """Whether every element of t is within FP32_STEP_TOL of ref's largest |value|."""
    return max_diff(t, ref) <= FP32_STEP_TOL * ref.abs().max().item()


def ref_weight_decay(s, g, method, lr, wd):
    """Emerging-Optimizers' WeightDecayMixin (emerging_optimizers/mixin.py) on
    RefParam s before the update: "decoupled" p ← p − wd·lr·p, "independent"
    p ← p − wd·p, "l2" g ← g + wd·p. Returns the gradient the update uses."""
    if method == "decoupled":
        s.p = s.p - wd * lr * s.p
    elif method == "independent":
        s.p = s.p - wd * s.p
    else:
        g = g + wd * s.p
    return g


def assert_matches_reference(opt, named, refs, buffers, steps=5):
    """Parameters and state of `opt` equal `refs` within FP32_STEP_TOL; the state
    holds "step" == steps and the keys of `buffers` ({key: RefParam attribute})."""
    for n, p in named:
        r = refs[n]
        assert within_fp32_steps(p, r.p), n
        st = opt.state[p]
        assert set(st) == {"step", *buffers} and int(st["step"]) == steps, (n, set(st))
        for key, attr in buffers.items():
            assert within_fp32_steps(st[key], getattr(r, attr)), (n, key)


def value_error(fn, *patterns):
    """Runs fn, expects ValueError whose message matches every regex in patterns;
    returns the message."""
    with pytest.raises(ValueError) as info:
        fn()
    msg = str(info.value)
    for pat in patterns:
        assert re.search(pat, msg), f"{pat!r} not found in {msg!r}"
    return msg


def stepped_matrix_and_bias(config):
    """muon_cpp.make_optimizer over an 8×4 matrix "w" and a bias "b" of 8 with
    `config` (a dict), after one step with gradients of ones: (opt, w, b)."""
    w = torch.nn.Parameter(torch.randn(8, 4))
    b = torch.nn.Parameter(torch.randn(8))
    import muon_cpp
    opt = muon_cpp.make_optimizer([("w", w), ("b", b)], config)
    w.grad, b.grad = torch.ones(8, 4), torch.ones(8)
    opt.step()
    return opt, w, b


def edit_refused_at_step(opt, p, key, value, *patterns):
    """Sets param group 0's `key` to `value`, gives p a gradient of ones and
    expects opt.step() to raise a ValueError matching every regex in
    patterns, with p unchanged; returns the message."""
    opt.param_groups[0][key] = value
    p.grad = torch.ones_like(p)
    before = p.detach().clone()
    msg = value_error(opt.step, *patterns)
    assert torch.equal(p.detach(), before)
    return msg
