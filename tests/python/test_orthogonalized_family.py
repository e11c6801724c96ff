"""muon_cpp.PolarGrad, Scion, MOP, SPEL, MuonHyperball and the registry's polargrad,
scion, mop, spel and muon_hyperball against NVIDIA-NeMo/Emerging-Optimizers' arithmetic.

The reference is written here with torch ops in fp64: EO's
OrthogonalizedOptimizer.step (decoupled decay, EMA momentum, optional Nesterov)
with each variant's scaled_orthogonalize_fn, Newton–Schulz with EO's quintic
tuples (5 steps) and MOP's polar factor by SVD (tests/test_orthogonalized_family.cpp
has the C++ side). fp32 parameters: each step rounds O(10–100) fp32 operations
per element (the momentum, the ≤ 12-long dots of Newton–Schulz, <O, M>, the
SVD), ~1e-7 of the update, so over 5 steps every value is within 1e-5 of the
largest of its tensor; a wrong scale or a missing Nesterov term is off by ~lr.
"""
import math

import pytest
import torch

import muon_cpp
from conftest import max_diff, value_error

FP32_STEP_TOL = 1e-5
QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def ns64(m):
    """EO's muon_utils.newton_schulz in fp64 (eps 1e-7 added to the norm)."""
    tall = m.shape[0] > m.shape[1]
    x = m.T if tall else m
    x = x / (x.norm() + 1e-7)
    for a, b, c in QUINTIC:
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


def ref_step(s, g, kind, lr, mu, wd, nesterov, extra=1.0, radius=1.0):
    g = g.to(torch.float64)
    s["p"] = s["p"] * (1 - lr * wd)
    s["buf"] = s["buf"] + (1 - mu) * (g - s["buf"])
    m = (g + mu * (s["buf"] - g) if nesterov else s["buf"]).reshape(s["p"].shape[0], -1)
    rows, cols = m.shape
    if kind == "polargrad":
        o = ns64(m)
        update = o * (o * m).sum() * extra
    elif kind == "scion":
        update = ns64(m) * math.sqrt(rows / cols) * radius
    elif kind == "mop":
        u, _, vh = torch.linalg.svd(m, full_matrices=False)
        update = (u @ vh) * math.sqrt(max(rows, cols)) * extra
    elif kind == "spel":
        update = ns64(m)
    else:  # muon_hyperball, radius from the weight (after the decay)
        R = s["p"].norm()
        u = ns64(m) * math.sqrt(max(rows, cols)) * extra
        update = u * R / u.norm().clamp_min(1e-8)
    s["p"] = s["p"] - lr * update.reshape(s["p"].shape)
    if kind == "spel":
        s["p"] = ns64(s["p"].reshape(rows, -1)).reshape(s["p"].shape)
    if kind == "muon_hyperball":
        s["p"] = s["p"] * R / s["p"].norm().clamp_min(1e-8)


CASES = {
    "polargrad": dict(fields={"polargrad_nesterov": True, "muon_extra_scale_factor": 0.7, "weight_decay": 0.05},
                      lr=0.004, wd=0.05, nesterov=True, extra=0.7),
    "scion": dict(fields={"scion_spectral_radius": 2.5}, lr=0.03, wd=1.0, nesterov=False, radius=2.5),
    "mop": dict(fields={"muon_extra_scale_factor": 1.3, "weight_decay": 0.05}, lr=0.02, wd=0.05,
                nesterov=False, extra=1.3),
    "spel": dict(fields={"weight_decay": 0.1, "spel_nesterov": True}, lr=0.05, wd=0.1, nesterov=True),
    "muon_hyperball": dict(fields={"weight_decay": 0.05, "muon_extra_scale_factor": 1.3}, lr=0.05,
                           wd=0.05, nesterov=False, extra=1.3),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_variant_from_make_optimizer_matches_emerging_optimizers(kind):
    case = CASES[kind]
    gen = torch.Generator().manual_seed(0)
    shapes = {"w": (6, 10), "tall": (12, 5), "conv": (8, 3, 2, 2), "b": (6,)}
    named = [(n, leaf(torch.randn(*s, generator=gen))) for n, s in shapes.items()]
    refs = {n: {"p": p.detach().double().clone(), "buf": torch.zeros(p.shape, dtype=torch.float64)}
            for n, p in named if p.dim() >= 2}
    config = {"optimizer": kind, "lr": case["lr"], "muon_momentum": 0.9}
    config.update(case["fields"])
    opt = muon_cpp.make_optimizer(named, config)
    kinds = {g["optimizer"] for g in opt.param_groups}
    assert kinds == {kind, "adamw"}  # the bias goes to the scalar optimizer
    for _ in range(5):
        for n, p in named:
            g = torch.randn(*p.shape, generator=gen)
            p.grad = g.clone()
            if n in refs:
                ref_step(refs[n], g, kind, case["lr"], 0.9, case["wd"], case["nesterov"],
                         case.get("extra", 1.0), case.get("radius", 1.0))
        opt.step()
    for n, p in named:
        if n not in refs:
            continue
        r = refs[n]["p"]
        assert max_diff(p, r) <= FP32_STEP_TOL * r.abs().max().item(), (kind, n)
        st = opt.state[p]
        assert set(st) == {"step", "momentum_buffer"} and int(st["step"]) == 5


def test_classes_have_emerging_optimizers_defaults_and_name_bad_values():
    p = leaf(torch.randn(4, 3))
    g = muon_cpp.PolarGrad([p]).param_groups[0]
    assert (g["lr"], g["weight_decay"], g["nesterov"], g["optimizer"]) == (3e-4, 0.01, False, "polargrad")
    g = muon_cpp.Scion([p]).param_groups[0]
    assert (g["lr"], g["weight_decay"], g["spectral_radius"]) == (3e-4, 1.0, 1.0)
    g = muon_cpp.MOP([p]).param_groups[0]
    assert (g["lr"], g["weight_decay"], g["nesterov"], g["scale_mode"]) == (3e-4, 0.01, False, "spectral")
    assert isinstance(muon_cpp.MOP([p]), torch.optim.Optimizer)
    value_error(lambda: muon_cpp.Scion([p], spectral_radius=-1.0), r"spectral_radius", r"-1")
    value_error(lambda: muon_cpp.PolarGrad([p], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.MOP([p], stacked_experts=True, weight_decay=0.0),
                r"stacked_experts")
    g = muon_cpp.SPEL([p]).param_groups[0]
    assert (g["lr"], g["weight_decay"], g["nesterov"], g["optimizer"]) == (3e-4, 0.1, False, "spel")
    g = muon_cpp.MuonHyperball([p]).param_groups[0]
    assert (g["weight_decay"], g["radius"], g["eps"], g["nesterov"]) == (0.01, 0.0, 1e-8, False)
    value_error(lambda: muon_cpp.MuonHyperball([p], radius=-1.0), r"radius", r"-1")
    q = leaf(torch.randn(5, 4))
    muon_cpp.MuonHyperball([q], radius=2.0)
    assert abs(q.norm().item() - 2.0) < 1e-5  # rescaled to the radius when built


@pytest.mark.parametrize("cls", [muon_cpp.PolarGrad, muon_cpp.Scion, muon_cpp.MOP, muon_cpp.SPEL,
                                 muon_cpp.MuonHyperball])
def test_state_dict_round_trip_resumes_bit_identically(cls):
    gen = torch.Generator().manual_seed(1)
    init = torch.randn(6, 4, generator=gen)
    grads = [torch.randn(6, 4, generator=gen) for _ in range(6)]
    a = leaf(init)
    straight = cls([a], lr=0.01)
    for g in grads:
        a.grad = g.clone()
        straight.step()
    b = leaf(init)
    first = cls([b], lr=0.01)
    for g in grads[:3]:
        b.grad = g.clone()
        first.step()
    saved = first.state_dict()
    c = leaf(b)
    second = cls([c], lr=0.5)
    second.load_state_dict(saved)
    assert second.param_groups[0]["lr"] == 0.01
    for g in grads[3:]:
        c.grad = g.clone()
        second.step()
    assert torch.equal(a, c)


def test_scion_refuses_the_settings_it_fixes_and_shows_what_runs():
    # Scion's step is Frank–Wolfe's p ← (1 − lr)·p − lr·update: weight decay 1,
    # decoupled, no Nesterov (EO fixes them). Other values used to be accepted,
    # shown in param_groups and replaced silently; now they are refused by name
    # wherever they are given, changing nothing.
    p = leaf(torch.randn(6, 4))
    g = muon_cpp.Scion([p]).param_groups[0]
    assert (g["weight_decay"], g["weight_decay_mode"], g["nesterov"]) == (1.0, "decoupled", False)
    value_error(lambda: muon_cpp.Scion([p], weight_decay=0.1), r"\[muon::Scion\]",
                r"weight_decay must be 1", r"0\.1")
    value_error(lambda: muon_cpp.Scion([{"params": [p], "weight_decay": 0.5}]),
                r"weight_decay must be 1", r"0\.5")
    value_error(lambda: muon_cpp.Scion([p], weight_decay_mode="cautious"),
                r"weight_decay_mode must be decoupled, got cautious")
    value_error(lambda: muon_cpp.Scion([p], nesterov=True), r"nesterov must be false")
    # A later param_groups edit: the step refuses it and changes nothing.
    opt = muon_cpp.Scion([p], lr=0.01)
    p.grad = torch.ones(6, 4)
    opt.step()
    before, buf = p.detach().clone(), opt.state[p]["momentum_buffer"].clone()
    for key, value, pattern in (("weight_decay", 0.5, r"weight_decay must be 1, got 0\.5|got 0\.5"),
                                ("weight_decay_mode", "cautious", r"got cautious"),
                                ("nesterov", True, r"nesterov must be false")):
        old = opt.param_groups[0][key]
        opt.param_groups[0][key] = value
        value_error(opt.step, pattern)
        assert torch.equal(p, before) and torch.equal(opt.state[p]["momentum_buffer"], buf)
        assert int(opt.state[p]["step"]) == 1
        opt.param_groups[0][key] = old
    opt.step()
    assert not torch.equal(p, before)


def test_scion_from_a_config_decays_its_matrices_by_1_and_says_so():
    model = torch.nn.Linear(4, 6)
    config = {"optimizer": "scion", "lr": 0.01, "weight_decay": 0.1}
    opt = muon_cpp.make_optimizer(model.named_parameters(), config)
    by_kind = {g["optimizer"]: g for g in opt.param_groups}
    assert by_kind["scion"]["weight_decay"] == 1.0 and by_kind["scion"]["nesterov"] is False
    assert by_kind["adamw"]["weight_decay"] == 0.1  # the config's, for the scalar optimizer
    value_error(lambda: muon_cpp.make_optimizer(model.named_parameters(),
                                                dict(config, muon_weight_decay_mode="cautious")),
                r"\[muon::Scion\]", r"weight_decay_mode must be decoupled, got cautious")
