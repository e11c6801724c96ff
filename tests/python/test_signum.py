"""muon_cpp.Signum and the registry's signum against the published update.

The reference is NVIDIA-NeMo/Emerging-Optimizers' Signum written with torch
ops in fp64: class Signum in emerging_optimizers/scalar_optimizers/__init__.py
at 2472b2eac466a562c20bf4366b2bb7866916c563 (decay by WeightDecayMixin,
emerging_optimizers/mixin.py, then calculate_signum_update,
scalar_optimizers/update_functions/signum.py at
b309e2f01cda75dc96a6dc1a2355a7b3b64b5e16); tests/test_signum.cpp has the C++
side. fp32 parameters: each step rounds p a few times (2⁻²⁴ relative), and
the sign is exact while its argument stays clear of 0 (checked: above 1e-5 of
the largest, ~100x the fp32 rounding of m's O(10) operations), so over 5
steps every value is within 1e-5 of the largest of its tensor; a wrong sign, decay or bias correction moves an element by 2·lr.
"""
import pytest
import torch

import muon_cpp
from conftest import (RefParam, assert_matches_reference, leaf, ref_weight_decay, seeded_params,
                      value_error, within_fp32_steps)


def ref_signum_step(s, g, t, lr, momentum, wd, method, correct_bias, nesterov):
    """One Signum step as Emerging-Optimizers takes it; returns min |u| / max |u|."""
    g = g.to(torch.float64)
    if s.buf is None:
        s.buf = torch.zeros_like(s.p)
    g = ref_weight_decay(s, g, method, lr, wd)
    s.buf = momentum * s.buf + (1 - momentum) * g
    c1 = 1 - momentum ** t if correct_bias else 1.0
    cn = 1 - momentum ** (t + 1) if correct_bias else 1.0
    u = momentum * s.buf / cn + (1 - momentum) * g / c1 if nesterov else s.buf / c1
    s.p = s.p - lr * torch.sign(u)
    return (u.abs().min() / u.abs().max()).item()


@pytest.mark.parametrize("method", ["decoupled", "independent", "l2"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_signum_from_make_optimizer_matches_the_published_update(method, nesterov):
    gen, named, refs = seeded_params(
        {"w": (5, 7), "tall": (12, 3), "conv": (4, 3, 3, 3), "experts": (3, 4, 5), "b": (6,)})
    opt = muon_cpp.make_optimizer(named, {"optimizer": "signum", "lr": 0.01, "weight_decay": 0.1,
                                          "signum_momentum": 0.8, "signum_nesterov": nesterov,
                                          "signum_weight_decay_method": method})
    g0 = opt.param_groups[0]
    assert g0["optimizer"] == "signum"
    assert (g0["momentum"], g0["nesterov"], g0["correct_bias"], g0["weight_decay_method"]) == \
        (0.8, nesterov, True, method)
    for t in range(1, 6):
        given = {}
        for n, p in named:
            g = torch.randn(*p.shape, generator=gen)
            p.grad, given[n] = g.clone(), g
            closest = ref_signum_step(refs[n], g, t, 0.01, 0.8, 0.1, method, True, nesterov)
            assert closest > 1e-5, n  # the sign's argument is clear of 0 (see the top)
        opt.step()
        assert all(torch.equal(p.grad, given[n]) for n, p in named)  # l2 decays a copy
    assert_matches_reference(opt, named, refs, {"exp_avg": "buf"})


def test_signum_class_with_groups_and_l2_leaves_the_gradient():
    gen = torch.Generator().manual_seed(1)
    a, b = leaf(torch.randn(4, 3, generator=gen)), leaf(torch.randn(5, generator=gen))
    opt = muon_cpp.Signum([dict(params=[a]), dict(params=[b], momentum=0.5, nesterov=True)],
                          lr=0.02, weight_decay=0.2, weight_decay_method="l2")
    assert isinstance(opt, torch.optim.Optimizer)
    ra, rb = RefParam(a), RefParam(b)
    for t in range(1, 6):
        ga, gb = torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen)
        a.grad, b.grad = ga.clone(), gb.clone()
        ref_signum_step(ra, ga, t, 0.02, 0.9, 0.2, "l2", True, False)
        ref_signum_step(rb, gb, t, 0.02, 0.5, 0.2, "l2", True, True)
        opt.step()
        assert torch.equal(a.grad, ga) and torch.equal(b.grad, gb)  # l2 decays a copy
    assert within_fp32_steps(a, ra.p)
    assert within_fp32_steps(b, rb.p)


def test_signum_defaults_and_errors():
    p = leaf(torch.randn(3))
    g = muon_cpp.Signum([p]).param_groups[0]
    assert (g["lr"], g["momentum"], g["weight_decay"], g["nesterov"], g["correct_bias"],
            g["weight_decay_method"]) == (1e-3, 0.9, 0.0, False, True, "decoupled")
    value_error(lambda: muon_cpp.Signum([p], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.Signum([p], momentum=1.0), r"momentum", r"1")
    value_error(lambda: muon_cpp.Signum([p], weight_decay=-2.0), r"weight_decay", r"-2")
    value_error(lambda: muon_cpp.Signum([p], weight_decay_method="palm"),
                r"weight_decay_method", r"palm")
