"""muon_cpp.Muon, AdaptiveMuon, Lion and MuonWithAdamW against plain reference steps.

The references (conftest.py) are the documented steps of
include/muon/optim/{muon,adaptive_muon,lion}.h written with torch ops in fp64,
Newton–Schulz included (the textbook formula with the set's tuples); the
AdamW half of MuonWithAdamW is compared with torch.optim.AdamW.

Tolerances:
 - fp64 parameters with ns_compute_dtype="float64": both sides evaluate the
   same formulas in fp64 and differ only by summation order (symmetric
   kernels, fused passes): ~1e-16 relative per operation, amplified by the
   polynomial's slope (< 5 per step, < 1e4 over 5 steps) on O(1) values. 1e-10
   absolute (the C++ suite's kFp64Tol) leaves a wide margin and still fails
   for any wrong term (lr·scale·update is >= 1e-3).
 - fp32 parameters and compute: Newton–Schulz in fp32 is ~1e-6 relative from
   fp64 and the elementwise passes add a few fp32 roundings (2⁻²⁴ each), so
   the change of a parameter over the run is within 1e-5 relative of the
   reference (the C++ suite's kFp32StepTol); a missing Nesterov or decay
   term changes it by > 1e-2.
"""
import copy
import itertools
import re
import sys
import threading
import time

import pytest
import torch
from torch import nn

import muon_cpp
from conftest import (RefParam, max_diff, ref_adaptive_step, ref_lion_step, ref_muon_step,
                      value_error)

FP64_TOL = 1e-10
FP32_STEP_TOL = 1e-5

# ---- helpers ----------------------------------------------------------------------------


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def run_muon_groups(groups, steps=3, dtype=torch.float64, seed=1234, check_each_step=True):
    """Steps muon_cpp.Muon over `groups` (list of (shapes, options)) and the
    reference on the same gradients; returns (worst fp64 abs diff of params
    and buffers, worst relative error of the parameters' change, optimizer)."""
    gen = torch.Generator().manual_seed(seed)
    params, refs, opts, starts, pgroups = [], [], [], [], []
    scale = 1.0 if dtype == torch.float64 else 0.02
    for shapes, o in groups:
        ps = []
        for shape in shapes:
            p = leaf((torch.randn(*shape, dtype=torch.float64, generator=gen) * scale).to(dtype))
            params.append(p)
            refs.append(RefParam(p))
            opts.append(o)
            starts.append(p.detach().to(torch.float64).clone())
            ps.append(p)
        pgroups.append(dict(o, params=ps))
    compute = "float64" if dtype == torch.float64 else "float32"
    opt = muon_cpp.Muon([dict(g, ns_compute_dtype=g.get("ns_compute_dtype", compute)) for g in pgroups])
    worst = 0.0
    for k in range(steps):
        for p, r, o in zip(params, refs, opts):
            g = torch.randn(*p.shape, dtype=torch.float64, generator=gen).to(dtype)
            p.grad = g.clone()
            ref_muon_step(r, g, o)
        opt.step()
        for p, r in zip(params, refs):
            st = opt.state[p]
            assert st["step"] == k + 1
            buf = st["momentum_buffer"]
            assert buf.shape == p.shape and buf.dtype == p.dtype
            if dtype == torch.float64:
                worst = max(worst, max_diff(p, r.p), max_diff(buf, r.buf))
            else:
                # fp32 buffer: a few fp32 roundings of O(1) values per step.
                assert torch.allclose(buf.double(), r.buf, rtol=1e-5, atol=1e-5)
    rel = 0.0
    for p, r, s in zip(params, refs, starts):
        d_ref = r.p - s
        d = p.detach().double() - s
        rel = max(rel, ((d - d_ref).norm() / d_ref.norm()).item())
    return worst, rel, opt


# The option combinations of the C++ suite (tests/test_muon_values.cpp):
# nesterov × momentum style × weight-decay mode × scale mode, with lr 0.05,
# μ 0.9, wd 0.1, extra scale 1.5 so that every term shows in the result.
COMBOS = list(itertools.product([True, False], ["ema", "classic"],
                                ["decoupled", "independent", "l2", "palm"],
                                ["shape_scaling", "spectral", "unit_rms_norm", "match_rms_adamw"]))


def combo_options(nesterov, style, wd_mode, scale):
    return dict(lr=0.05, momentum=0.9, nesterov=nesterov, momentum_style=style, weight_decay=0.1,
                weight_decay_mode=wd_mode, scale_mode=scale, extra_scale_factor=1.5)


def combo_id(c):
    return "-".join(["nesterov" if c[0] else "plain", *c[1:]])


# tall, wide, very wide, square and a conv weight (viewed as 8 × 27)
MATRIX_SHAPES = [(12, 8), (6, 10), (4, 16), (7, 7), (8, 3, 3, 3)]


# ---- Muon -----------------------------------------------------------------------------------


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_muon_fp64_matches_reference(combo):
    worst, _, _ = run_muon_groups([(MATRIX_SHAPES, combo_options(*combo))], steps=3)
    assert worst < FP64_TOL


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_muon_fp32_matches_reference(combo):
    shapes = [(48, 32), (24, 40), (16, 64), (28, 28), (8, 3, 3, 3)]
    _, rel, opt = run_muon_groups([(shapes, combo_options(*combo))], steps=3, dtype=torch.float32)
    assert rel < FP32_STEP_TOL
    for g in opt.param_groups:
        for p in g["params"]:
            assert p.dtype == torch.float32


def test_muon_shapes_in_groups_with_different_options():
    # Four groups, each with its own options: plain matrices and a conv
    # weight; stacked experts (each expert its own matrix); a fused QKV split
    # into [q, k, v]; a per-query-group split with another coefficient set,
    # step count and eps mode.
    groups = [
        ([(12, 8), (8, 3, 3, 3)], dict(lr=0.04, momentum=0.9, weight_decay=0.05)),
        ([(3, 6, 10), (2, 12, 4), (5, 8)],
         dict(lr=0.03, stacked_experts=True, scale_mode="spectral", momentum_style="classic",
              nesterov=False, weight_decay=0.01, weight_decay_mode="independent")),
        ([(12, 10)], dict(lr=0.02, split_qkv=True, qkv_split_sizes=[6, 3, 3], scale_mode="spectral")),
        ([(16, 12)], dict(lr=0.02, split_qkv=True, qkv_split_sizes=[4, 2, 2], num_query_groups=2,
                          scale_mode="unit_rms_norm", coefficient_type="simple", num_ns_steps=3,
                          ns_eps_mode="clamp", extra_scale_factor=0.7)),
    ]
    worst, _, opt = run_muon_groups(groups, steps=3)
    assert worst < FP64_TOL
    assert opt.param_groups[1]["stacked_experts"] is True
    assert list(opt.param_groups[3]["qkv_split_sizes"]) == [4, 2, 2]
    # fp32 parameters and compute through the same groups.
    _, rel, _ = run_muon_groups(groups, steps=3, dtype=torch.float32)
    assert rel < FP32_STEP_TOL


def test_split_and_experts_are_not_no_ops():
    # Guards the test above: the same gradients without the split / the
    # experts flag give a visibly different result (> 1e-3 against 1e-10).
    split = [([(12, 10)], dict(split_qkv=True, qkv_split_sizes=[6, 3, 3]))]
    whole = [([(12, 10)], dict())]
    _, _, a = run_muon_groups(split, steps=1)
    _, _, b = run_muon_groups(whole, steps=1)
    assert max_diff(a.param_groups[0]["params"][0], b.param_groups[0]["params"][0]) > 1e-3
    experts = [([(3, 6, 10)], dict(stacked_experts=True))]
    flat = [([(3, 6, 10)], dict())]
    _, _, a = run_muon_groups(experts, steps=1)
    _, _, b = run_muon_groups(flat, steps=1)
    assert max_diff(a.param_groups[0]["params"][0], b.param_groups[0]["params"][0]) > 1e-3


@pytest.mark.parametrize("coeffs,steps", [("simple", 0), ("simple", 3), ("quintic", 7),
                                          ("polar_express", 0), ("polar_express_5", 0), ("cans", 0),
                                          ("aol", 0), ("deepseekv4", 0), ("cubic", 0), ("cubic5", 0)])
def test_muon_coefficient_sets(coeffs, steps):
    o = dict(coefficient_type=coeffs, num_ns_steps=steps, weight_decay=0.02)
    worst, _, _ = run_muon_groups([([(10, 6), (6, 14)], o)], steps=2)
    assert worst < FP64_TOL


def test_muon_eps_modes_differ_where_eps_matters():
    # ns_eps = 1 against gradients of norm ~1e-1..1: add divides by ‖u‖ + 1,
    # clamp by max(‖u‖, 1), so the two modes give different steps, each
    # equal to its own reference.
    results = {}
    for mode in ("add", "clamp"):
        o = dict(ns_eps=1.0, ns_eps_mode=mode, momentum=0.0, nesterov=False)
        worst, _, opt = run_muon_groups([([(5, 7)], o)], steps=2, seed=5)
        assert worst < FP64_TOL, mode
        results[mode] = opt.param_groups[0]["params"][0].detach().clone()
    assert max_diff(results["add"], results["clamp"]) > 1e-4


def test_muon_bf16_compute():
    # bf16 Newton–Schulz is ~4e-3–9e-3 relative from fp64 (the plain bf16
    # formula ~1.7e-2); 3e-2 is the C++ suite's kBf16StepTol. It must not be
    # as close as fp32 compute (1e-5): bf16 input rounding alone is ~2⁻⁹.
    _, rel, opt = run_muon_groups([([(48, 32), (24, 40)], dict(ns_compute_dtype="bfloat16"))],
                                  steps=3, dtype=torch.float32)
    assert 1e-4 < rel < 3e-2
    assert opt.param_groups[0]["ns_compute_dtype"] in ("bfloat16", torch.bfloat16)


def test_muon_defaults():
    p = leaf(torch.randn(12, 20))
    opt = muon_cpp.Muon([p])
    g = opt.param_groups[0]
    expected = dict(lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, momentum_style="ema",
                    weight_decay_mode="decoupled", coefficient_type="quintic", num_ns_steps=0,
                    ns_eps=1e-7, ns_eps_mode="add", scale_mode="shape_scaling",
                    extra_scale_factor=1.0, stacked_experts=False, split_qkv=False,
                    num_query_groups=1)
    for k, v in expected.items():
        assert g[k] == v, k
    assert list(g["qkv_split_sizes"]) == []
    assert g["optimizer"] == "muon"
    assert isinstance(g["names"], list) and len(g["names"]) == 1
    # The default step is the reference with these defaults, in fp32.
    r = RefParam(p)
    start = r.p.clone()
    for _ in range(2):
        grad = torch.randn(12, 20)
        p.grad = grad.clone()
        ref_muon_step(r, grad, {})
        opt.step()
    d_ref = r.p - start
    assert ((p.detach().double() - start - d_ref).norm() / d_ref.norm()).item() < FP32_STEP_TOL


def test_names_from_named_parameters():
    model = nn.Sequential(nn.Linear(6, 8, bias=False), nn.Linear(8, 4, bias=False))
    opt = muon_cpp.Muon(model.named_parameters())
    assert opt.param_groups[0]["names"] == ["0.weight", "1.weight"]
    assert opt.param_groups[0]["params"][0] is model[0].weight


# ---- AdaptiveMuon ----------------------------------------------------------------------------

ADAPTIVE_COMBOS = [
    dict(),
    dict(scale_mode="spectral", extra_scale_factor=1.5),
    dict(nesterov=False, momentum_style="classic", weight_decay_mode="l2", scale_mode="unit_rms_norm"),
    dict(weight_decay_mode="independent", scale_mode="match_rms_adamw", coefficient_type="polar_express_5"),
    dict(weight_decay_mode="palm", momentum_style="classic", ns_eps_mode="clamp",
         coefficient_type="simple", num_ns_steps=3),
]


@pytest.mark.parametrize("mode", ["normuon", "adamuon", "namo"])
@pytest.mark.parametrize("extra", ADAPTIVE_COMBOS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()) or "default")
def test_adaptive_muon_matches_reference(mode, extra):
    gen = torch.Generator().manual_seed(7)
    o = dict(lr=0.05, momentum=0.9, weight_decay=0.1)
    o.update(extra)
    beta2, eps = 0.9, 1e-8
    shapes = [(6, 10), (12, 5), (4, 3, 2, 2)]
    params = [leaf(torch.randn(*s, dtype=torch.float64, generator=gen)) for s in shapes]
    refs = [RefParam(p) for p in params]
    if mode == "namo" and o.get("weight_decay_mode") == "l2":
        # As in Emerging-Optimizers: namo's second moment is of the raw gradient.
        value_error(lambda: muon_cpp.AdaptiveMuon(params, mode=mode, **o), r"l2", r"namo")
        return
    opt = muon_cpp.AdaptiveMuon(params, mode=mode, beta2=beta2, eps=eps, ns_compute_dtype="float64", **o)
    assert isinstance(opt, torch.optim.Optimizer)
    for k in range(4):
        for p, r in zip(params, refs):
            g = torch.randn(*p.shape, dtype=torch.float64, generator=gen)
            p.grad = g.clone()
            ref_adaptive_step(r, g, o, mode, beta2, eps)
        opt.step()
        for p, r in zip(params, refs):
            st = opt.state[p]
            assert st["step"] == k + 1
            assert max_diff(p, r.p) < FP64_TOL, (mode, k)
            assert max_diff(st["momentum_buffer"], r.buf) < FP64_TOL
            v = st["second_moment"]
            rows = p.shape[0]
            cols = p.numel() // rows
            # include/muon/optim/adaptive_muon.h: (rows, 1) for normuon, (rows, cols) for adamuon.
            # namo: (rows, 1), every entry the matrix's one scalar.
            assert tuple(v.shape) == ((rows, 1) if mode != "adamuon" else (rows, cols))
            # v ~ (1-β2)·O² with O entries ~1/√cols: 1e-12 absolute is fp64 rounding with margin;
            # namo's v ~ ‖g‖² ~ 60: relative.
            scale = 1.0 if mode != "namo" else r.v.abs().max().item()
            assert max_diff(v, r.v.reshape(v.shape)) < 1e-12 * scale


def test_adaptive_muon_fp32():
    gen = torch.Generator().manual_seed(8)
    for mode in ("normuon", "adamuon", "namo"):
        params = [leaf(torch.randn(*s, generator=gen) * 0.02) for s in [(32, 24), (16, 40)]]
        refs = [RefParam(p) for p in params]
        starts = [r.p.clone() for r in refs]
        o = dict(lr=0.05, weight_decay=0.01, scale_mode="spectral")
        opt = muon_cpp.AdaptiveMuon(params, mode=mode, **o)
        for _ in range(3):
            for p, r in zip(params, refs):
                g = torch.randn(*p.shape, generator=gen)
                p.grad = g.clone()
                ref_adaptive_step(r, g, o, mode, 0.95, 1e-8)
            opt.step()
        for p, r, s in zip(params, refs, starts):
            d_ref = r.p - s
            # 1e-4: Newton–Schulz's fp32 error (~1e-6 relative) passes through
            # the division by √v + ε, which scales entries by up to ~10×;
            # any formula difference is O(1e-1).
            assert ((p.detach().double() - s - d_ref).norm() / d_ref.norm()).item() < 1e-4, mode


def test_adaptive_muon_errors():
    p = leaf(torch.randn(4, 6))
    value_error(lambda: muon_cpp.AdaptiveMuon([p], mode="adam"), r"mode", r"adam")
    value_error(lambda: muon_cpp.AdaptiveMuon([p], beta2=1.0), r"beta2", r"1")
    value_error(lambda: muon_cpp.AdaptiveMuon([p], eps=0.0), r"eps", r"0")
    e = leaf(torch.randn(2, 4, 6))
    value_error(lambda: muon_cpp.AdaptiveMuon([e], stacked_experts=True), r"stacked_experts")
    q = leaf(torch.randn(8, 6))
    value_error(lambda: muon_cpp.AdaptiveMuon([q], split_qkv=True, qkv_split_sizes=[4, 2, 2]),
                r"split")


# ---- Lion -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lion_matches_paper_formula(dtype):
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 7), (3,), (4, 2, 3)]
    params = [leaf(torch.randn(*s, dtype=torch.float64, generator=gen).to(dtype)) for s in shapes]
    refs = [RefParam(p) for p in params]
    groups = [dict(params=params[:2], lr=0.01, beta1=0.8, beta2=0.95, weight_decay=0.3),
              dict(params=params[2:], lr=0.02, beta1=0.9, beta2=0.99, weight_decay=0.0)]
    hyper = [(0.01, 0.8, 0.95, 0.3)] * 2 + [(0.02, 0.9, 0.99, 0.0)]
    opt = muon_cpp.Lion(groups)
    # fp64: the same operations (lerp vs weighted sum differ by rounding
    # only; the sign never flips for random normal inputs): 1e-12. fp32: each
    # step rounds p (|p| < 5) to fp32, 2⁻²⁴·5 per operation, a few per
    # step over 5 steps: 1e-5.
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for k in range(5):
        for p, r, h in zip(params, refs, hyper):
            g = torch.randn(*p.shape, dtype=torch.float64, generator=gen).to(dtype)
            p.grad = g.clone()
            ref_lion_step(r, g, *h)
        opt.step()
        for p, r in zip(params, refs):
            assert max_diff(p, r.p) < tol, k
            st = opt.state[p]
            assert st["step"] == k + 1
            assert st["exp_avg"].shape == p.shape and st["exp_avg"].dtype == dtype
            assert max_diff(st["exp_avg"], r.buf) < tol


def test_lion_defaults_and_every_coordinate_moves_by_lr():
    p = leaf(torch.zeros(4, 4))
    opt = muon_cpp.Lion([p])
    g = opt.param_groups[0]
    assert (g["lr"], g["beta1"], g["beta2"], g["weight_decay"]) == (1e-4, 0.9, 0.99, 0.0)
    assert g["optimizer"] == "lion"
    opt.param_groups[0]["lr"] = 0.5
    p.grad = torch.randn(4, 4)
    opt.step()
    assert torch.equal(p.detach().abs(), torch.full((4, 4), 0.5))


def test_lion_errors():
    p = leaf(torch.randn(3))
    value_error(lambda: muon_cpp.Lion([p], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.Lion([p], beta1=1.0), r"beta1", r"1")
    value_error(lambda: muon_cpp.Lion([p], beta2=-0.1), r"beta2", r"-0\.1")
    value_error(lambda: muon_cpp.Lion([p], weight_decay=-2.0), r"weight_decay", r"-2")


# ---- MuonWithAdamW --------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class TinyLm(nn.Module):
    """Embedding, one residual MLP block with a LayerNorm and biases, an output head."""

    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.block = Block(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        return self.lm_head(self.block(self.embed(tokens)))


MUON_NAMES = ["block.fc1.weight", "block.fc2.weight"]


def make_model(seed, dtype=torch.float32):
    torch.manual_seed(seed)
    return TinyLm().to(dtype)


def make_grads(model, steps, seed=99):
    gen = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(*p.shape, generator=gen).to(p.dtype) for n, p in model.named_parameters()}
            for _ in range(steps)]


def set_grads(model, grads):
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()


def groups_by_kind(opt):
    muon = [g for g in opt.param_groups if g["optimizer"] == "muon"]
    adamw = [g for g in opt.param_groups if g["optimizer"] == "adamw"]
    assert len(muon) + len(adamw) == len(opt.param_groups)
    return muon, adamw


def test_hybrid_routing():
    model = make_model(1)
    opt = muon_cpp.MuonWithAdamW(model.named_parameters())
    assert isinstance(opt, torch.optim.Optimizer)
    muon, adamw = groups_by_kind(opt)
    assert sorted(n for g in muon for n in g["names"]) == MUON_NAMES
    others = sorted(n for n, _ in model.named_parameters() if n not in MUON_NAMES)
    assert sorted(n for g in adamw for n in g["names"]) == others
    # names and params line up
    named = dict(model.named_parameters())
    for g in opt.param_groups:
        assert len(g["names"]) == len(g["params"])
        for n, p in zip(g["names"], g["params"]):
            assert named[n] is p
    for g in adamw:
        assert g["lr"] == 3e-4 and g["weight_decay"] == 0.0
    for g in muon:
        assert g["lr"] == 0.02


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hybrid_equals_reference_muon_and_torch_adamw(dtype):
    model = make_model(2, dtype)
    twin = copy.deepcopy(model)
    grads = make_grads(model, 4)
    muon_opts = dict(lr=0.03, weight_decay=0.01, momentum=0.9, scale_mode="spectral",
                     extra_scale_factor=0.2)
    compute = "float64" if dtype == torch.float64 else "float32"
    opt = muon_cpp.MuonWithAdamW(model.named_parameters(), adamw_lr=1e-3, adamw_betas=(0.8, 0.95),
                                 adamw_eps=1e-6, adamw_weight_decay=0.05, ns_compute_dtype=compute,
                                 **muon_opts)
    named = dict(model.named_parameters())
    twin_named = dict(twin.named_parameters())
    others = [twin_named[n] for n in twin_named if n not in MUON_NAMES]
    adamw = torch.optim.AdamW(others, lr=1e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)
    refs = {n: RefParam(named[n]) for n in MUON_NAMES}
    starts = {n: named[n].detach().double().clone() for n in MUON_NAMES}
    for k, g in enumerate(grads):
        set_grads(model, g)
        set_grads(twin, g)
        for n in MUON_NAMES:
            ref_muon_step(refs[n], g[n], muon_opts)
        opt.step()
        adamw.step()
        for n, p in named.items():
            st = opt.state[p]
            assert st["step"] == k + 1, n
            if n in MUON_NAMES:
                if dtype == torch.float64:
                    assert max_diff(p, refs[n].p) < FP64_TOL, n
                    assert max_diff(st["momentum_buffer"], refs[n].buf) < FP64_TOL, n
            else:
                # torch.optim.AdamW in the same dtype: the same operations
                # (LibTorch's AdamW and torch.optim.AdamW are one algorithm),
                # at most a few roundings apart per step: 1e-12 in fp64, 1e-6
                # (|p| < 4, 2⁻²⁴ per operation, a few per step) in fp32.
                tol = 1e-12 if dtype == torch.float64 else 1e-6
                t = adamw.state[twin_named[n]]
                assert max_diff(p, twin_named[n]) < tol, n
                assert max_diff(st["exp_avg"], t["exp_avg"]) < tol, n
                assert max_diff(st["exp_avg_sq"], t["exp_avg_sq"]) < tol, n
    if dtype == torch.float32:
        for n in MUON_NAMES:
            d_ref = refs[n].p - starts[n]
            d = named[n].detach().double() - starts[n]
            assert ((d - d_ref).norm() / d_ref.norm()).item() < FP32_STEP_TOL, n


def test_hybrid_muon_half_equals_standalone_muon_bit_for_bit():
    # The hybrid's Muon half is muon_cpp.Muon with the same options.
    model = make_model(3)
    twin = copy.deepcopy(model)
    grads = make_grads(model, 3)
    opt = muon_cpp.MuonWithAdamW(model.named_parameters(), lr=0.03, weight_decay=0.1)
    tn = dict(twin.named_parameters())
    alone = muon_cpp.Muon([tn[n] for n in MUON_NAMES], lr=0.03, weight_decay=0.1)
    for g in grads:
        set_grads(model, g)
        set_grads(twin, g)
        opt.step()
        alone.step()
    named = dict(model.named_parameters())
    for n in MUON_NAMES:
        assert torch.equal(named[n], tn[n]), n


def test_hybrid_scheduler_sees_every_group():
    model = make_model(4)
    twin = copy.deepcopy(model)
    opt = muon_cpp.MuonWithAdamW(model.named_parameters(), lr=0.04, adamw_lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    tn = dict(twin.named_parameters())
    others = [tn[n] for n in tn if n not in MUON_NAMES]
    adamw = torch.optim.AdamW(others, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    sched_t = torch.optim.lr_scheduler.StepLR(adamw, step_size=1, gamma=0.5)
    named = dict(model.named_parameters())
    refs = {n: RefParam(named[n]) for n in MUON_NAMES}
    lr = 0.04
    for k, g in enumerate(make_grads(model, 3)):
        set_grads(model, g)
        set_grads(twin, g)
        for n in MUON_NAMES:
            ref_muon_step(refs[n], g[n], dict(lr=lr))
        opt.step()
        adamw.step()
        sched.step()
        sched_t.step()
        lr *= 0.5
        muon, adw = groups_by_kind(opt)
        assert all(gr["lr"] == pytest.approx(lr, rel=1e-15) for gr in muon)
        assert all(gr["lr"] == pytest.approx(1e-2 * 0.5 ** (k + 1), rel=1e-15) for gr in adw)
    for n, p in named.items():
        if n in MUON_NAMES:
            # fp32 parameters moved by ~lr per step: the reference's fp64
            # values within a few fp32 Newton–Schulz errors (1e-6 relative
            # of lr·scale ~ 0.04): 1e-6 absolute.
            assert max_diff(p, refs[n].p) < 1e-6, n
        else:
            assert max_diff(p, tn[n]) < 1e-6, n


def test_hybrid_errors():
    model = make_model(5)
    value_error(lambda: muon_cpp.MuonWithAdamW(model.named_parameters(), adamw_lr=-1.0), r"lr", r"-1")
    value_error(lambda: muon_cpp.MuonWithAdamW(model.named_parameters(), adamw_betas=(1.5, 0.9)),
                r"beta", r"1\.5")
    value_error(lambda: muon_cpp.MuonWithAdamW(model.named_parameters(), momentum=2.0), r"momentum", r"2")
    value_error(lambda: muon_cpp.MuonWithAdamW(model.named_parameters(), momentun=0.9),
                r"momentun", r"did you mean", r"momentum")


# ---- param_groups edits ------------------------------------------------------------------------


def test_lr_edited_by_hand_is_honoured_next_step():
    gen = torch.Generator().manual_seed(11)
    p = leaf(torch.randn(8, 12, dtype=torch.float64, generator=gen))
    r = RefParam(p)
    opt = muon_cpp.Muon([p], lr=0.05, ns_compute_dtype="float64")
    o = dict(lr=0.05)
    for k, edit in enumerate([None, dict(lr=0.01), dict(momentum=0.5, nesterov=False),
                              dict(scale_mode="spectral", weight_decay=0.2)]):
        if edit:
            opt.param_groups[0].update(edit)
            o.update(edit)
        g = torch.randn(8, 12, dtype=torch.float64, generator=gen)
        p.grad = g.clone()
        ref_muon_step(r, g, o)
        opt.step()
        assert max_diff(p, r.p) < FP64_TOL, (k, edit)
        assert max_diff(opt.state[p]["momentum_buffer"], r.buf) < FP64_TOL, (k, edit)


@pytest.mark.parametrize("kind", ["StepLR", "LambdaLR"])
def test_lr_scheduler_drives_lr(kind):
    gen = torch.Generator().manual_seed(12)
    a = leaf(torch.randn(8, 12, dtype=torch.float64, generator=gen))
    b = leaf(torch.randn(10, 6, dtype=torch.float64, generator=gen))
    opt = muon_cpp.Muon([dict(params=[a], lr=0.08), dict(params=[b], lr=0.02, momentum=0.8)],
                        ns_compute_dtype="float64")
    if kind == "StepLR":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        factor = lambda k: 0.1 ** (k // 2)  # noqa: E731
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lambda k: 1.0 / (1 + k))
        factor = lambda k: 1.0 / (1 + k)  # noqa: E731
    refs = [RefParam(a), RefParam(b)]
    base = [dict(lr=0.08), dict(lr=0.02, momentum=0.8)]
    for k in range(5):
        for p, r, o in zip([a, b], refs, base):
            g = torch.randn(*p.shape, dtype=torch.float64, generator=gen)
            p.grad = g.clone()
            ref_muon_step(r, g, dict(o, lr=o["lr"] * factor(k)))
        opt.step()
        sched.step()
        for p, r in zip([a, b], refs):
            assert max_diff(p, r.p) < FP64_TOL, k
        assert opt.param_groups[0]["lr"] == pytest.approx(0.08 * factor(k + 1), rel=1e-12)


def test_bad_group_value_raises_at_step_and_changes_nothing():
    gen = torch.Generator().manual_seed(13)
    a = leaf(torch.randn(6, 8, generator=gen))
    b = leaf(torch.randn(8, 6, generator=gen))
    opt = muon_cpp.Muon([dict(params=[a]), dict(params=[b])])
    for p in (a, b):
        p.grad = torch.randn(*p.shape, generator=gen)
    opt.step()
    before = [p.detach().clone() for p in (a, b)]
    bufs = [opt.state[p]["momentum_buffer"].clone() for p in (a, b)]
    for group, key, value in [(0, "momentum", 1.5), (1, "momentum", 1.5), (1, "lr", -0.1),
                              (0, "weight_decay_mode", "bogus"), (1, "coefficient_type", "quintik"),
                              (0, "num_ns_steps", 1000), (1, "ns_eps", 0.0)]:
        good = opt.param_groups[group][key]
        opt.param_groups[group][key] = value
        for p in (a, b):
            p.grad = torch.randn(*p.shape, generator=gen)
        value_error(opt.step, re.escape(key))
        for p, want, buf in zip((a, b), before, bufs):
            assert torch.equal(p.detach(), want), key
            assert opt.state[p]["step"] == 1, key
            assert torch.equal(opt.state[p]["momentum_buffer"], buf), key
        opt.param_groups[group][key] = good
    opt.step()  # fixed: steps again
    assert opt.state[a]["step"] == 2
    assert not torch.equal(a.detach(), before[0])


def test_bad_constructor_arguments_name_them():
    p = leaf(torch.randn(4, 6))
    value_error(lambda: muon_cpp.Muon([p], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.Muon([p], momentum=1.0), r"momentum", r"1")
    value_error(lambda: muon_cpp.Muon([p], weight_decay=-0.5), r"weight_decay", r"-0\.5")
    value_error(lambda: muon_cpp.Muon([p], momentum_style="nesterov"), r"momentum_style", r"nesterov")
    value_error(lambda: muon_cpp.Muon([p], weight_decay_mode="adamw"), r"weight_decay_mode", r"adamw")
    value_error(lambda: muon_cpp.Muon([p], coefficient_type="quintik"), r"coefficient_type", r"quintik")
    value_error(lambda: muon_cpp.Muon([p], num_ns_steps=100), r"num_ns_steps", r"100")
    value_error(lambda: muon_cpp.Muon([p], ns_eps=0.0), r"ns_eps", r"0")
    value_error(lambda: muon_cpp.Muon([p], ns_eps_mode="mul"), r"ns_eps_mode", r"mul")
    value_error(lambda: muon_cpp.Muon([p], scale_mode="rms"), r"scale_mode", r"rms")
    value_error(lambda: muon_cpp.Muon([p], extra_scale_factor=0.0), r"extra_scale_factor", r"0")
    value_error(lambda: muon_cpp.Muon([p], ns_compute_dtype="int32"), r"ns_compute_dtype", r"int32")
    value_error(lambda: muon_cpp.Muon([p], momentun=0.9), r"momentun", r"did you mean", r"momentum")
    value_error(lambda: muon_cpp.Muon([dict(params=[p], scale_modee="spectral")]), r"scale_modee",
                r"did you mean", r"scale_mode")
    # Muon takes matrices only.
    value_error(lambda: muon_cpp.Muon([leaf(torch.randn(5))]), r"ndim", r"\[5\]")


# ---- step / zero_grad semantics --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["muon", "adaptive", "lion", "hybrid"])
def test_step_closure_and_zero_grad(kind):
    torch.manual_seed(14)
    if kind == "hybrid":
        model = make_model(14)
        opt = muon_cpp.MuonWithAdamW(model.named_parameters())
        tokens = torch.randint(32, (8,))
        loss_fn = lambda: nn.functional.cross_entropy(model(tokens), (tokens * 7 + 3) % 32)  # noqa: E731
        params = list(model.parameters())
    else:
        w = leaf(torch.randn(8, 6))
        x = torch.randn(4, 8)
        params = [w]
        opt = {"muon": muon_cpp.Muon, "adaptive": muon_cpp.AdaptiveMuon, "lion": muon_cpp.Lion}[kind]([w])
        loss_fn = lambda: (x @ w).pow(2).sum()  # noqa: E731
    assert isinstance(opt, torch.optim.Optimizer)
    before = [p.detach().clone() for p in params]
    calls = []
    losses = []

    def closure():
        calls.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        losses.append(loss)
        return loss

    with torch.no_grad():
        ret = opt.step(closure)
    assert calls == [True]
    assert isinstance(ret, torch.Tensor) and torch.equal(ret, losses[0])
    assert all(p.grad is not None for p in params)
    assert any(not torch.equal(p.detach(), b) for p, b in zip(params, before))
    assert opt.step() is None  # no closure: None returned, as torch.optim
    opt.zero_grad(set_to_none=False)
    for p in params:
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.zero_grad()  # the contract's default: set_to_none=True
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("kind", ["muon", "adaptive", "lion"])
def test_params_without_grad_are_skipped(kind):
    gen = torch.Generator().manual_seed(15)
    a = leaf(torch.randn(6, 8, generator=gen))
    b = leaf(torch.randn(8, 6, generator=gen))
    opt = {"muon": muon_cpp.Muon, "adaptive": muon_cpp.AdaptiveMuon, "lion": muon_cpp.Lion}[kind]([a, b])
    b_before = b.detach().clone()
    a.grad = torch.randn(6, 8, generator=gen)
    opt.step()
    assert torch.equal(b.detach(), b_before)
    assert len(opt.state.get(b, {})) == 0
    assert len(opt.state[a]) > 0 and opt.state[a]["step"] == 1
    sd = opt.state_dict()
    assert 1 not in sd["state"] and 0 in sd["state"]
    # Once it has a gradient it steps and gets state.
    b.grad = torch.randn(8, 6, generator=gen)
    opt.step()
    assert not torch.equal(b.detach(), b_before)
    assert opt.state[b]["step"] == 1 and opt.state[a]["step"] == 2


def test_hybrid_params_without_grad_are_skipped():
    model = make_model(16)
    opt = muon_cpp.MuonWithAdamW(model.named_parameters())
    named = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in named.items()}
    named["block.fc1.weight"].grad = torch.randn(32, 16)
    named["block.norm.weight"].grad = torch.randn(16)
    opt.step()
    for n, p in named.items():
        stepped = n in ("block.fc1.weight", "block.norm.weight")
        assert torch.equal(p.detach(), before[n]) != stepped, n
        assert (len(opt.state.get(p, {})) > 0) == stepped, n


# ---- the GIL --------------------------------------------------------------------------------------


def test_step_releases_the_gil():
    # A second Python thread counts while opt.step() runs. Its loop sleeps
    # ~10 µs per iteration (releasing the GIL), and the switch interval is set
    # to 30 s, so the main thread never loses the GIL by preemption: the
    # counter can only advance while the main thread has released the GIL.
    # Control: during a C call that holds the GIL (builtin sum over a range)
    # it advances ~0 times. A step on four 384×384 matrices (~1 GFLOP of
    # Newton–Schulz each, three times) runs for tens of milliseconds on any
    # CPU, during which the counter advances thousands of times if the GIL is
    # released: >= 100 is a wide margin, not a timing bound.
    gen = torch.Generator().manual_seed(17)
    params = [leaf(torch.randn(384, 384, generator=gen)) for _ in range(4)]
    opt = muon_cpp.Muon(params)
    for p in params:
        p.grad = torch.randn(384, 384, generator=gen)
    opt.step()  # state and scratch created outside the measurement
    count = [0]
    stop = [False]

    def spin():
        while not stop[0]:
            count[0] += 1
            time.sleep(1e-5)

    old = sys.getswitchinterval()
    thread = threading.Thread(target=spin, daemon=True)
    sys.setswitchinterval(30.0)
    try:
        thread.start()
        time.sleep(0.02)

        def advance_during(fn):
            before = count[0]
            fn()
            return count[0] - before

        held = advance_during(lambda: sum(range(3_000_000)))
        released = advance_during(lambda: [opt.step() for _ in range(3)])
    finally:
        stop[0] = True
        thread.join()
        sys.setswitchinterval(old)
    assert held < 10, f"control: the counter advanced {held} times while the GIL was held"
    assert released >= 100, f"the counter advanced only {released} times during opt.step()"
