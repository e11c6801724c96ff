"""muon_cpp.compat: torch.optim.Muon's and Keller Jordan's signatures over the engine.

Each class is compared with a plain-torch reference written here from the
published code (torch/optim/_muon.py of pytorch/pytorch at commit
098e03f91de9384cc3afdf5c8b9a6bbc442bd66a; muon.py of KellerJordan/Muon at
commit 00ba60d3a0d188993831f86e4d62597bb0e9b21c), never by calling muon_cpp:

- fp32 Newton–Schulz (``ns_dtype=torch.float32``) against the reference in
  fp64 over 5 steps, within 1e-5 of the parameter's largest value. Our fp32
  run rounds each product to 2^-24 relative; Newton–Schulz's iterates stay
  O(1) (spectral norm <= ~1.2) so a step's update is exact to a few 1e-7 of
  lr·scale, and 5 steps of lr <= 0.05 add < 1e-6 to parameters of size ~1,
  on any CPU whatever its summation order.
- bf16 Newton–Schulz (the default, as the originals) against the fp64
  reference, within BF16_FACTOR times the published bf16 code's own error
  against that fp64 reference (measured here on the same inputs).
"""
import inspect
import re
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import max_diff, value_error  # noqa: E402

from muon_cpp.compat.keller import MuonWithAuxAdam, SingleDeviceMuonWithAuxAdam  # noqa: E402
from muon_cpp.compat.torch import Muon  # noqa: E402

FP32_TOL = 1e-5  # relative to max|p_ref|; reasoning in the module docstring
# Ours and the published code both compute the fp64 step with bf16 roundings
# (8 significant bits, 2^-9 relative) in Newton–Schulz. The published code
# rounds every intermediate (each product, each a·X + B·X) to bf16; the engine
# rounds the iterates to bf16 for its products and accumulates and combines
# them in fp32, so it rounds at a subset of those places: its error is at most
# the original's (factor 1; measured 0.06-0.56 over 114 matrices, 6 seeds,
# docs/python.md). The other summation orders of another CPU change the fp32
# accumulations by ~2^-24, nothing next to 2^-9; 1.5 leaves room for the
# bf16 roundings to fall differently on another instruction set.
BF16_FACTOR = 1.5
STEPS = 5


def gen(seed):
    return torch.Generator().manual_seed(seed)


def make_params(shapes, seed):
    g = gen(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]


def make_grads(shapes, seed, steps=STEPS):
    g = gen(seed + 1000)
    return [[torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
            for _ in range(steps)]


def leaves(values):
    return [torch.nn.Parameter(v.to(torch.float32).clone()) for v in values]


# ---- references, from the published code -----------------------------------------------


def torch_ns(grad, coeffs, steps, eps, dtype):
    """torch/optim/_muon.py _zeropower_via_newtonschulz (use_addmm=False) in `dtype`."""
    a, b, c = coeffs
    x = grad.to(dtype)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        upd = b * gram + c * gram @ gram
        x = a * x + upd @ x
    if tall:
        x = x.T
    return x


def torch_adjust(lr, fn, shape):
    A, B = shape[:2]
    if fn is None or fn == "original":
        return lr * math.sqrt(max(1, A / B))
    return lr * 0.2 * math.sqrt(max(A, B))


def torch_muon_ref(p0, grads, ns_dtype, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                   ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
                   adjust_lr_fn=None, dtype=torch.float64, bufs0=None):
    """torch.optim.Muon's _single_tensor_muon, params and buffers in `dtype`
    (the buffers start from bufs0, or zero)."""
    ps = [p.to(dtype).clone() for p in p0]
    bufs = ([torch.zeros_like(p) for p in ps] if bufs0 is None
            else [b.to(dtype).clone() for b in bufs0])
    for step_grads in grads:
        for p, buf, g in zip(ps, bufs, step_grads):
            g = g.to(dtype)
            buf.lerp_(g, 1 - momentum)
            u = g.lerp(buf, momentum) if nesterov else buf
            o = torch_ns(u, ns_coefficients, ns_steps, eps, ns_dtype)
            p.mul_(1 - lr * weight_decay)
            p.add_(o.to(dtype), alpha=-torch_adjust(lr, adjust_lr_fn, p.shape))
    return ps, bufs


def keller_ns(G, steps, dtype):
    """KellerJordan/Muon zeropower_via_newtonschulz5 with its bf16 replaced by `dtype`."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.to(dtype)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def keller_ref(groups, p0, grads, ns_dtype, dtype=torch.float64):
    """SingleDeviceMuonWithAuxAdam.step, 5 times. groups: dicts of use_muon, lr,
    ... and "idx" (indices into p0); grads[t][i] None: no gradient at step t."""
    ps = [p.to(dtype).clone() for p in p0]
    state = {}
    for step_grads in grads:
        for gr in groups:
            for i in gr["idx"]:
                p = ps[i]
                g = step_grads[i]
                g = torch.zeros_like(p) if g is None else g.to(dtype).clone()
                st = state.setdefault(i, {})
                if gr["use_muon"]:
                    if not st:
                        st["momentum_buffer"] = torch.zeros_like(p)
                    beta = gr["momentum"]
                    st["momentum_buffer"].lerp_(g, 1 - beta)
                    update = g.lerp_(st["momentum_buffer"], beta)
                    if update.ndim == 4:
                        update = update.view(len(update), -1)
                    update = keller_ns(update, 5, ns_dtype).to(dtype)
                    update *= max(1, g.size(-2) / g.size(-1)) ** 0.5
                    p.mul_(1 - gr["lr"] * gr["weight_decay"])
                    p.add_(update.reshape(p.shape), alpha=-gr["lr"])
                else:
                    if not st:
                        st["exp_avg"] = torch.zeros_like(p)
                        st["exp_avg_sq"] = torch.zeros_like(p)
                        st["step"] = 0
                    st["step"] += 1
                    b1, b2 = gr["betas"]
                    st["exp_avg"].lerp_(g, 1 - b1)
                    st["exp_avg_sq"].lerp_(g.square(), 1 - b2)
                    m = st["exp_avg"] / (1 - b1 ** st["step"])
                    v = st["exp_avg_sq"] / (1 - b2 ** st["step"])
                    p.mul_(1 - gr["lr"] * gr["weight_decay"])
                    p.add_(m / (v.sqrt() + gr["eps"]), alpha=-gr["lr"])
    return ps, state


def run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else g.to(p.dtype).clone()
        opt.step()


def within(ours, ref, tol=FP32_TOL):
    return max_diff(ours, ref) <= tol * ref.abs().max().item()


# ---- torch.optim.Muon ------------------------------------------------------------------

TORCH_SHAPES = [(6, 10), (12, 5), (7, 7)]
TORCH_VARIANTS = {
    "defaults": {},
    "lr_wd": dict(lr=0.03, weight_decay=0.2),
    "match_rms_adamw": dict(lr=0.02, adjust_lr_fn="match_rms_adamw"),
    "original": dict(lr=0.02, adjust_lr_fn="original"),
    "no_nesterov": dict(lr=0.02, nesterov=False, momentum=0.9),
    "custom_ns": dict(lr=0.02, ns_coefficients=(3.0, -3.2, 1.2), ns_steps=3),
    # eps above ‖u‖ (~8): clamp divides by eps itself, add would by ‖u‖ + eps.
    "clamp_eps": dict(lr=0.02, eps=30.0),
}


@pytest.mark.parametrize("variant", sorted(TORCH_VARIANTS))
def test_torch_muon_fp32_equals_published_step(variant):
    kw = TORCH_VARIANTS[variant]
    p0 = make_params(TORCH_SHAPES, 1)
    grads = make_grads(TORCH_SHAPES, 1)
    params = leaves(p0)
    opt = Muon(params, ns_dtype=torch.float32, **kw)
    run(opt, params, grads)
    ref, bufs = torch_muon_ref(p0, grads, torch.float64, **kw)
    for p, r, b, w0 in zip(params, ref, bufs, p0):
        assert within(p, r), (variant, tuple(p.shape), max_diff(p, r))
        assert within(opt.state[p]["momentum_buffer"], b)
        # Not the initial value: the step moved it by far more than the tolerance.
        assert max_diff(r, w0) > 10 * FP32_TOL * r.abs().max().item()


def test_torch_muon_clamp_differs_from_add():
    # The clamp variant's reference with "add" (X / (‖X‖ + eps)) is far off: the
    # comparison above can tell the two modes apart.
    kw = TORCH_VARIANTS["clamp_eps"]
    p0 = make_params(TORCH_SHAPES, 1)
    grads = make_grads(TORCH_SHAPES, 1)
    params = leaves(p0)
    run(Muon(params, ns_dtype=torch.float32, **kw), params, grads)
    ref, _ = torch_muon_ref(p0, grads, torch.float64, **dict(kw, eps=1e-7))
    # eps 30 normalizes u to ‖X‖ < 1, so NS's output differs from eps 1e-7's.
    assert max_diff(params[0], ref[0]) > 1e-3


def bf16_errors(ours, ref_bf16, ref64):
    """(our error, the published bf16 code's error), each vs fp64, max |.|."""
    return max_diff(ours, ref64), max_diff(ref_bf16, ref64)


@pytest.mark.parametrize("variant", ["defaults", "match_rms_adamw", "no_nesterov"])
def test_torch_muon_bf16_within_the_originals_bf16_error(variant):
    kw = dict(TORCH_VARIANTS[variant])
    kw.setdefault("lr", 0.02)
    p0 = make_params(TORCH_SHAPES, 2)
    grads = make_grads(TORCH_SHAPES, 2)
    params = leaves(p0)
    run(Muon(params, **kw), params, grads)  # bf16 by default, as torch
    ref64, _ = torch_muon_ref(p0, grads, torch.float64, **kw)
    # The published code as torch runs it: fp32 parameters, bf16 Newton–Schulz.
    ref16, _ = torch_muon_ref(p0, grads, torch.bfloat16, dtype=torch.float32, **kw)
    for p, r64, r16, w0 in zip(params, ref64, ref16, p0):
        ours, theirs = bf16_errors(p, r16, r64)
        assert theirs > 0
        assert ours <= BF16_FACTOR * theirs, (variant, tuple(p.shape), ours, theirs)
        # The bound is a fifth of the step's change at most: it tells a step apart.
        assert max_diff(r64, w0) > 5 * theirs


def test_torch_muon_defaults_are_torchs():
    published = {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
                 "ns_coefficients": (3.4445, -4.775, 2.0315), "eps": 1e-7, "ns_steps": 5,
                 "adjust_lr_fn": None, "use_addmm": False}
    sig = inspect.signature(Muon)
    names = list(sig.parameters)
    assert names[:len(published) + 1] == ["params", *published]
    for k, v in published.items():
        assert sig.parameters[k].default == v, k
    assert sig.parameters["ns_dtype"].kind == inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["ns_dtype"].default is torch.bfloat16
    opt = Muon([torch.nn.Parameter(torch.zeros(3, 4))])
    g = opt.param_groups[0]
    assert set(g) == {"params", "ns_dtype", *published}
    assert {k: g[k] for k in published} == published
    if hasattr(torch.optim, "Muon"):
        theirs = inspect.signature(torch.optim.Muon).parameters
        for k in published:
            if k in theirs:
                assert theirs[k].default == sig.parameters[k].default, k


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_torch_muon_equals_torch_optim_muon():
    p0 = make_params(TORCH_SHAPES, 3)
    grads = make_grads(TORCH_SHAPES, 3)
    a, b = leaves(p0), leaves(p0)
    run(Muon(a, lr=0.02), a, grads)
    run(torch.optim.Muon(b, lr=0.02), b, grads)
    ref64, _ = torch_muon_ref(p0, grads, torch.float64, lr=0.02)
    for x, y, r in zip(a, b, ref64):
        assert max_diff(x, r) <= BF16_FACTOR * max(max_diff(y, r), 1e-30)


BAD_TORCH_ARGS = [
    (dict(lr=-0.1), r"lr .*-0\.1"),
    (dict(lr=float("nan")), r"lr .*nan"),
    (dict(weight_decay=-1.0), r"weight_decay .*-1\.0"),
    (dict(momentum=1.0), r"momentum .*1\.0"),
    (dict(momentum=-0.5), r"momentum .*-0\.5"),
    (dict(eps=0.0), r"eps .*0\.0"),
    (dict(ns_steps=0), r"ns_steps .*0"),
    (dict(ns_steps=100), r"ns_steps .*100"),
    (dict(ns_steps=2.5), r"ns_steps .*2\.5"),
    (dict(ns_coefficients=(1.0, 2.0)), r"ns_coefficients .*\(1\.0, 2\.0\)"),
    (dict(ns_coefficients=(1.0, float("inf"), 2.0)), r"ns_coefficients\[1\] .*inf"),
    (dict(adjust_lr_fn="spectral"), r"adjust_lr_fn.*'spectral'"),
    (dict(nesterov="yes"), r"nesterov .*'yes'"),
    (dict(ns_dtype=torch.int32), r"ns_dtype .*int32"),
    (dict(lr=torch.tensor([0.1, 0.2])), r"lr must be 1-element"),
]


@pytest.mark.parametrize("kwargs,pattern", BAD_TORCH_ARGS)
def test_torch_muon_rejects_bad_arguments(kwargs, pattern):
    msg = value_error(lambda: Muon([torch.nn.Parameter(torch.zeros(3, 4))], **kwargs), pattern)
    assert len(msg) < 300


@pytest.mark.parametrize("kwargs,instead", [
    (dict(ns_coefficients=(3.4445, -4.775, 2.0315)),
     r"coefficient_type='custom' with ns_coefficient_a=a, ns_coefficient_b=b, ns_coefficient_c=c"),
    (dict(ns_steps=6), r"takes num_ns_steps;"),
    (dict(eps=1e-6), r"takes ns_eps, with ns_eps_mode='clamp'"),
    (dict(adjust_lr_fn="match_rms_adamw"), r"takes scale_mode \("),
])
def test_torch_muon_arguments_given_to_muon_cpp_muon_say_what_to_give(kwargs, instead):
    import muon_cpp
    key = next(iter(kwargs))
    w = torch.nn.Parameter(torch.zeros(3, 4))
    for make in (lambda: muon_cpp.Muon([w], **kwargs),
                 lambda: muon_cpp.MuonWithAdamW([("w", w)], **kwargs),
                 lambda: muon_cpp.Muon([w]).add_param_group(
                     dict(params=[torch.nn.Parameter(torch.zeros(2, 2))], **kwargs))):
        msg = value_error(make, rf"{key}=.* is torch.optim.Muon's argument; 'muon' takes ",
                          instead, r"or use muon_cpp.compat.torch.Muon")
        assert len(msg) < 400
    # What the message says to give runs as torch's ns_coefficients: custom
    # coefficients (with torch's eps clamp, EMA momentum and 5 steps) step as
    # muon_cpp.compat.torch.Muon with those ns_coefficients, bit for bit.
    if key == "ns_coefficients":
        g = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
        a, b = torch.nn.Parameter(torch.ones(3, 4)), torch.nn.Parameter(torch.ones(3, 4))
        ours = muon_cpp.Muon([a], lr=0.1, weight_decay=0.1, coefficient_type="custom",
                             ns_coefficient_a=3.0, ns_coefficient_b=-3.2, ns_coefficient_c=1.2,
                             num_ns_steps=5, ns_eps=1e-7, ns_eps_mode="clamp",
                             momentum_style="ema", ns_compute_dtype="float32")
        theirs = Muon([b], lr=0.1, weight_decay=0.1, ns_coefficients=(3.0, -3.2, 1.2),
                      ns_dtype=torch.float32)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4)])
def test_torch_muon_rejects_non_matrices_as_torch(shape):
    value_error(lambda: Muon([torch.nn.Parameter(torch.zeros(*shape))]),
                r"Muon only supports 2D parameters whereas we found a parameter with size: "
                + re.escape(str(torch.Size(shape))))


def test_torch_muon_bad_group_edit_changes_nothing():
    p0 = make_params(TORCH_SHAPES, 4)
    grads = make_grads(TORCH_SHAPES, 4, steps=2)
    params = leaves(p0)
    opt = Muon(params, lr=0.02)
    run(opt, params, grads[:1])
    before = [p.detach().clone() for p in params]
    bufs = [opt.state[p]["momentum_buffer"].clone() for p in params]
    opt.param_groups[0]["momentum"] = 1.5
    for p, g in zip(params, grads[1]):
        p.grad = g.float()
    value_error(opt.step, r"momentum .*1\.5")
    for p, b, s in zip(params, before, bufs):
        assert torch.equal(p, b) and torch.equal(opt.state[p]["momentum_buffer"], s)
        assert opt.state[p]["step"] == 1


def test_torch_muon_group_edits_and_schedulers_take_effect():
    p0 = make_params(TORCH_SHAPES[:1], 5)
    grads = make_grads(TORCH_SHAPES[:1], 5)
    params = leaves(p0)
    opt = Muon(params, lr=0.02, ns_dtype=torch.float32)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    lrs = []
    for step_grads in grads:
        lrs.append(opt.param_groups[0]["lr"])
        params[0].grad = step_grads[0].float()
        opt.step()
        sched.step()
    assert lrs == [0.02, 0.02, 0.01, 0.01, 0.005]
    # The reference with that schedule, step by step.
    p, buf = p0[0].clone(), torch.zeros_like(p0[0])
    for lr, (g,) in zip(lrs, grads):
        buf.lerp_(g, 0.05)
        o = torch_ns(g.lerp(buf, 0.95), (3.4445, -4.775, 2.0315), 5, 1e-7, torch.float64)
        p = p * (1 - lr * 0.1) - torch_adjust(lr, None, p.shape) * o
    assert within(params[0], p)
    # momentum and ns_steps edits: the next step uses them.
    opt.param_groups[0].update(momentum=0.5, ns_steps=2, weight_decay=0.0, lr=0.01)
    params[0].grad = grads[0][0].float()
    opt.step()
    buf.lerp_(grads[0][0], 0.5)
    o = torch_ns(grads[0][0].lerp(buf, 0.5), (3.4445, -4.775, 2.0315), 2, 1e-7, torch.float64)
    p = p - torch_adjust(0.01, None, p.shape) * o
    assert within(params[0], p)


def test_torch_muon_state_dict_round_trip():
    p0 = make_params(TORCH_SHAPES, 6)
    grads = make_grads(TORCH_SHAPES, 6)
    a = leaves(p0)
    opt_a = Muon(a, lr=0.02, momentum=0.9, adjust_lr_fn="match_rms_adamw")
    run(opt_a, a, grads[:2])
    sd = opt_a.state_dict()
    assert set(sd["param_groups"][0]) == set(opt_a.param_groups[0])
    assert sd["param_groups"][0]["momentum"] == 0.9
    assert set(sd["state"][0]) == {"momentum_buffer", "step"}
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = Muon(b)  # other values: the state dict's take over
    opt_b.load_state_dict(sd)
    assert opt_b.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    assert opt_b.param_groups[0]["lr"] == 0.02
    # torch.optim.Muon's own state has no step: it loads too.
    c = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_c = Muon(c)
    sd_c = opt_a.state_dict()
    sd_c["state"] = {k: {"momentum_buffer": v["momentum_buffer"]} for k, v in sd_c["state"].items()}
    opt_c.load_state_dict(sd_c)
    run(opt_a, a, grads[2:])
    run(opt_b, b, grads[2:])
    run(opt_c, c, grads[2:])
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y) and torch.equal(x, z)
    for x, y in zip(a, b):
        assert torch.equal(opt_a.state[x]["momentum_buffer"], opt_b.state[y]["momentum_buffer"])


def test_torch_muon_bad_state_dict_changes_nothing():
    p0 = make_params(TORCH_SHAPES, 7)
    a = leaves(p0)
    opt = Muon(a, lr=0.02)
    run(opt, a, make_grads(TORCH_SHAPES, 7, steps=1))
    sd = opt.state_dict()
    sd["param_groups"][0]["ns_steps"] = 0
    before = opt.state_dict()
    value_error(lambda: opt.load_state_dict(sd), r"ns_steps .*0")
    assert opt.param_groups[0]["ns_steps"] == 5
    after = opt.state_dict()
    for k in before["state"]:
        assert torch.equal(before["state"][k]["momentum_buffer"], after["state"][k]["momentum_buffer"])


# ---- Keller Jordan's MuonWithAuxAdam -----------------------------------------------

KELLER_SHAPES = [(6, 10), (12, 5), (6, 2, 3, 1), (2, 7, 4), (5,), (9, 4)]


def keller_setup(seed, none_at=None):
    p0 = make_params(KELLER_SHAPES, seed)
    grads = make_grads(KELLER_SHAPES, seed)
    if none_at is not None:
        step, i = none_at
        grads[step][i] = None
    groups = [dict(use_muon=True, idx=[0, 1, 2, 3], lr=0.05, momentum=0.9, weight_decay=0.1),
              dict(use_muon=False, idx=[4], lr=0.01, betas=(0.8, 0.95), eps=1e-10,
                   weight_decay=0.05),
              dict(use_muon=False, idx=[5], lr=3e-4, betas=(0.9, 0.95), eps=1e-10,
                   weight_decay=0)]
    return p0, grads, groups


def keller_groups(groups, params):
    return [dict({k: v for k, v in g.items() if k != "idx"}, params=[params[i] for i in g["idx"]])
            for g in groups]


@pytest.mark.parametrize("cls", [SingleDeviceMuonWithAuxAdam, MuonWithAuxAdam])
def test_keller_fp32_equals_published_step(cls):
    # A gradient missing at step 2 (a Muon matrix) and 3 (an Adam vector): Keller
    # steps it with zeros.
    for none_at in [(2, 1), (3, 4)]:
        p0, grads, groups = keller_setup(8, none_at)
        params = leaves(p0)
        opt = cls(keller_groups(groups, params), ns_dtype=torch.float32)
        run(opt, params, grads)
        ref, state = keller_ref(groups, p0, grads, torch.float64)
        for i, (p, r) in enumerate(zip(params, ref)):
            assert within(p, r), (i, tuple(p.shape), max_diff(p, r))
            assert max_diff(r, p0[i]) > 10 * FP32_TOL * r.abs().max().item()
            for k, v in state[i].items():
                if k == "step":
                    assert opt.state[p]["step"] == v
                else:
                    assert within(opt.state[p][k], v), (i, k)


def test_keller_conv_scale_is_kellers():
    # (6, 2, 3, 1): Keller scales by max(1, 3/1)^0.5 (the last two dimensions),
    # not from the (6, 6) view (1): the comparison above tells them apart.
    p0, grads, groups = keller_setup(9)
    ref, _ = keller_ref(groups, p0, grads, torch.float64)
    params = leaves(p0)
    run(SingleDeviceMuonWithAuxAdam(keller_groups(groups, params), ns_dtype=torch.float32),
        params, grads)
    step = (ref[2] - p0[2]).abs().max().item()
    assert within(params[2], ref[2]) and step > 0.1


def test_keller_bf16_within_the_originals_bf16_error():
    p0, grads, groups = keller_setup(10)
    params = leaves(p0)
    run(SingleDeviceMuonWithAuxAdam(keller_groups(groups, params)), params, grads)
    ref64, _ = keller_ref(groups, p0, grads, torch.float64)
    ref16, _ = keller_ref(groups, p0, grads, torch.bfloat16, dtype=torch.float32)
    for i in range(4):  # the Muon parameters
        ours, theirs = bf16_errors(params[i], ref16[i], ref64[i])
        assert theirs > 0 and ours <= BF16_FACTOR * theirs, (i, ours, theirs)
        assert max_diff(ref64[i], p0[i]) > 5 * theirs
    for i in range(4, 6):  # Adam: no bf16 anywhere
        assert within(params[i], ref64[i])


def test_keller_defaults_are_kellers():
    w, b = torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(4))
    user = [dict(params=[w], use_muon=True), dict(params=[b], use_muon=False)]
    opt = SingleDeviceMuonWithAuxAdam(user)
    m, a = opt.param_groups
    assert {k: m[k] for k in ("lr", "momentum", "weight_decay", "use_muon")} == dict(
        lr=0.02, momentum=0.95, weight_decay=0, use_muon=True)
    assert {k: a[k] for k in ("lr", "betas", "eps", "weight_decay", "use_muon")} == dict(
        lr=3e-4, betas=(0.9, 0.95), eps=1e-10, weight_decay=0, use_muon=False)
    assert set(m) == {"params", "lr", "momentum", "weight_decay", "use_muon"}
    assert set(a) == {"params", "lr", "betas", "eps", "weight_decay", "use_muon"}
    assert set(user[0]) == {"params", "use_muon"}  # the caller's dicts are not changed


BAD_KELLER_GROUPS = [
    ([dict(lr=0.02)], r"param_groups\[0\] has no 'use_muon'"),
    ([dict(use_muon=1)], r"param_groups\[0\]\['use_muon'\] .*1"),
    ([dict(use_muon=True, nesterov=False)], r"param_groups\[0\].*unexpected: \['nesterov'\]"),
    ([dict(use_muon=False, momentum=0.9)], r"param_groups\[0\].*unexpected: \['momentum'\]"),
    ([dict(use_muon=True, lr=-1.0)], r"param_groups\[0\]\['lr'\] .*-1\.0"),
    ([dict(use_muon=True, momentum=1.0)], r"param_groups\[0\]\['momentum'\] .*1\.0"),
    ([dict(use_muon=False, betas=(0.9,))], r"param_groups\[0\]\['betas'\] .*\(0\.9,\)"),
    ([dict(use_muon=False, betas=(0.9, 1.5))], r"param_groups\[0\]\['betas'\]\[1\] .*1\.5"),
    ([dict(use_muon=False, eps=0.0)], r"param_groups\[0\]\['eps'\] .*0\.0"),
    ([dict(use_muon=False, weight_decay=-0.1)], r"param_groups\[0\]\['weight_decay'\] .*-0\.1"),
]


@pytest.mark.parametrize("groups,pattern", BAD_KELLER_GROUPS)
def test_keller_rejects_bad_groups(groups, pattern):
    for cls in (SingleDeviceMuonWithAuxAdam, MuonWithAuxAdam):
        gs = [dict(g, params=[torch.nn.Parameter(torch.zeros(3, 4))]) for g in groups]
        msg = value_error(lambda: cls(gs), pattern)
        assert len(msg) < 300


def test_keller_rejects_vectors_in_muon_groups():
    value_error(lambda: SingleDeviceMuonWithAuxAdam(
        [dict(params=[torch.nn.Parameter(torch.zeros(4))], use_muon=True)]),
        r"param_groups\[0\]: a Muon parameter must have 2, 3 or 4 dimensions.*\[4\]")


def test_keller_state_dict_round_trip():
    p0, grads, groups = keller_setup(11)
    a = leaves(p0)
    opt_a = SingleDeviceMuonWithAuxAdam(keller_groups(groups, a))
    run(opt_a, a, grads[:2])
    sd = opt_a.state_dict()
    assert [set(g) for g in sd["param_groups"]] == [set(g) for g in opt_a.param_groups]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    fresh = [dict(use_muon=g["use_muon"], idx=g["idx"]) for g in groups]
    opt_b = SingleDeviceMuonWithAuxAdam(keller_groups(fresh, b))
    opt_b.load_state_dict(sd)
    assert opt_b.param_groups[1]["betas"] == (0.8, 0.95)
    run(opt_a, a, grads[2:])
    run(opt_b, b, grads[2:])
    for x, y in zip(a, b):
        assert torch.equal(x, y)
        for k, v in opt_a.state[x].items():
            w = opt_b.state[y][k]
            assert (torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w), k


def test_keller_distributed_on_two_gloo_ranks_equals_single_device():
    from ranks import run_ranks
    results = run_ranks("compat_keller", 2)
    single = results[0]["single"]
    for r in results:
        for i, (x, y) in enumerate(zip(r["params"], single)):
            # The owner runs the same code on the same whole matrix and the
            # all-gather copies bytes; Adam runs on every rank.
            assert torch.equal(x, y), (r["rank"], i, max_diff(x, y))
    # Both ranks own some of the Muon parameters.
    assert sorted(set(results[0]["owners"])) == [0, 1]


def measure_bf16(seeds=range(2, 8)):
    """Our bf16 error over the published bf16 code's, both against the fp64 step
    (5 steps), per matrix: the numbers docs/python.md quotes. Run:
    PYTHONPATH=build/python python3 tests/python/test_compat.py"""
    ratios = []
    for variant in ["defaults", "match_rms_adamw", "no_nesterov", "lr_wd", "custom_ns"]:
        kw = dict(TORCH_VARIANTS[variant])
        kw.setdefault("lr", 0.02)
        for seed in seeds:
            p0, grads = make_params(TORCH_SHAPES, seed), make_grads(TORCH_SHAPES, seed)
            params = leaves(p0)
            run(Muon(params, **kw), params, grads)
            ref64, _ = torch_muon_ref(p0, grads, torch.float64, **kw)
            ref16, _ = torch_muon_ref(p0, grads, torch.bfloat16, dtype=torch.float32, **kw)
            ratios += [("torch", variant, seed, tuple(p.shape), *bf16_errors(p, r16, r64))
                       for p, r64, r16 in zip(params, ref64, ref16)]
    for seed in [s + 8 for s in seeds]:
        p0, grads, groups = keller_setup(seed)
        params = leaves(p0)
        run(SingleDeviceMuonWithAuxAdam(keller_groups(groups, params)), params, grads)
        ref64, _ = keller_ref(groups, p0, grads, torch.float64)
        ref16, _ = keller_ref(groups, p0, grads, torch.bfloat16, dtype=torch.float32)
        ratios += [("keller", "muon", seed, tuple(params[i].shape),
                    *bf16_errors(params[i], ref16[i], ref64[i])) for i in range(4)]
    return ratios


if __name__ == "__main__":
    rows = measure_bf16()
    for who, variant, seed, shape, ours, theirs in rows:
        print(f"{who:6s} {variant:16s} seed {seed:2d} {str(shape):14s} ours/original {ours / theirs:.2f}")
    r = [ours / theirs for *_, ours, theirs in rows]
    print(f"{len(r)} matrices: ours/original bf16 error min {min(r):.2f} max {max(r):.2f}")
