"""muon_cpp.SimAdEMAMix and the registry's sim_ademamix against the published update.

The reference is NVIDIA-NeMo/Emerging-Optimizers' SimplifiedAdEMAMix written
with torch ops in fp64: class SimplifiedAdEMAMix in
emerging_optimizers/scalar_optimizers/__init__.py at
2472b2eac466a562c20bf4366b2bb7866916c563 (decay by WeightDecayMixin,
emerging_optimizers/mixin.py, then calculate_sim_ademamix_update,
scalar_optimizers/update_functions/ademamix.py at
ab596e0c89dd69bf46f9a773ae8f1e98c68e2af1; the β warmup as in
scalar_optimizers/ademamix.py at f424e8c7af1c29ff4a30baffeb5c4a9c0612b9f6;
arXiv:2502.02431); tests/test_sim_ademamix.cpp has the C++ side. fp32
parameters: each step rounds p and the moments O(10–20) times per element
(2⁻²⁴ relative each) on a ratio of values of order 1, so over 5 steps every
value is within 1e-5 of the largest of its tensor; a wrong β, α, decay or
bias correction is off by > 1e-3.
"""
import math

import pytest
import torch

import muon_cpp
from conftest import (RefParam, assert_matches_reference, leaf, ref_weight_decay, seeded_params,
                      value_error, within_fp32_steps)


def ref_beta(t, beta1, warmup, min_beta):
    """Emerging-Optimizers' _linear_half_life_warmup_scheduler."""
    if not warmup or t >= warmup:
        return beta1

    def f(b):
        return math.log(0.5) / math.log(b + 1e-8) - 1

    a = t / warmup
    return math.pow(0.5, 1 / ((1 - a) * f(min_beta) + a * f(beta1) + 1))


def ref_step(s, g, t, lr, beta1, beta2, eps, wd, method="decoupled", correct_bias=True,
             warmup=0, min_beta=0.9, alpha=2.0):
    g = g.to(torch.float64)
    if s.buf is None:
        s.buf, s.v = torch.zeros_like(s.p), torch.zeros_like(s.p)
    g = ref_weight_decay(s, g, method, lr, wd)
    b = ref_beta(t, beta1, warmup, min_beta)
    s.buf = b * s.buf + g
    s.v = beta2 * s.v + (1 - beta2) * g * g
    c1 = (1 - b ** t) / (1 - b) if correct_bias else 1.0
    c2 = 1 - beta2 ** t if correct_bias else 1.0
    s.p = s.p - lr * (alpha * g + s.buf / c1) / ((s.v / c2).sqrt() + eps)


@pytest.mark.parametrize("method", ["decoupled", "independent", "l2"])
@pytest.mark.parametrize("warmup", [0, 4])
def test_sim_ademamix_from_make_optimizer_matches_the_published_update(method, warmup):
    gen, named, refs = seeded_params(
        {"w": (5, 7), "tall": (12, 3), "conv": (4, 3, 3, 3), "experts": (3, 4, 5), "b": (6,)})
    opt = muon_cpp.make_optimizer(named, {
        "optimizer": "sim_ademamix", "lr": 0.01, "weight_decay": 0.1,
        "sim_ademamix_beta1": 0.95, "sim_ademamix_beta2": 0.9,
        "sim_ademamix_num_beta_fast_warmup_steps": warmup, "sim_ademamix_min_beta_fast": 0.5,
        "sim_ademamix_alpha": 1.5, "sim_ademamix_weight_decay_method": method})
    g0 = opt.param_groups[0]
    assert g0["optimizer"] == "sim_ademamix"
    assert (g0["beta1"], g0["beta2"], g0["eps"], g0["correct_bias"], g0["alpha"],
            g0["num_beta_fast_warmup_steps"], g0["min_beta_fast"], g0["weight_decay_method"]) == \
        (0.95, 0.9, 1e-8, True, 1.5, warmup, 0.5, method)
    for t in range(1, 6):
        for n, p in named:
            g = torch.randn(*p.shape, generator=gen)
            p.grad = g.clone()
            ref_step(refs[n], g, t, 0.01, 0.95, 0.9, 1e-8, 0.1, method, True, warmup, 0.5, 1.5)
        opt.step()
    assert_matches_reference(opt, named, refs, {"exp_avg": "buf", "exp_avg_sq": "v"})


def test_sim_ademamix_class_with_groups():
    gen = torch.Generator().manual_seed(1)
    a, b = leaf(torch.randn(4, 3, generator=gen)), leaf(torch.randn(5, generator=gen))
    opt = muon_cpp.SimAdEMAMix([dict(params=[a]), dict(params=[b], correct_bias=False, alpha=0.5)],
                               lr=0.02, weight_decay=0.2, beta1=0.9, beta2=0.95,
                               num_beta_fast_warmup_steps=None)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups[0]["num_beta_fast_warmup_steps"] == 0  # None: no warmup
    ra, rb = RefParam(a), RefParam(b)
    for t in range(1, 6):
        ga, gb = torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen)
        a.grad, b.grad = ga.clone(), gb.clone()
        ref_step(ra, ga, t, 0.02, 0.9, 0.95, 1e-8, 0.2)
        ref_step(rb, gb, t, 0.02, 0.9, 0.95, 1e-8, 0.2, correct_bias=False, alpha=0.5)
        opt.step()
    assert within_fp32_steps(a, ra.p)
    assert within_fp32_steps(b, rb.p)


def test_sim_ademamix_defaults_and_errors():
    p = leaf(torch.randn(3))
    g = muon_cpp.SimAdEMAMix([p]).param_groups[0]
    assert (g["lr"], g["beta1"], g["beta2"], g["eps"], g["weight_decay"], g["correct_bias"],
            g["num_beta_fast_warmup_steps"], g["min_beta_fast"], g["alpha"],
            g["weight_decay_method"]) == \
        (1e-3, 0.9999, 0.999, 1e-8, 0.0, True, 0, 0.9, 2.0, "decoupled")
    value_error(lambda: muon_cpp.SimAdEMAMix([p], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.SimAdEMAMix([p], beta1=1.0), r"beta1", r"1")
    value_error(lambda: muon_cpp.SimAdEMAMix([p], eps=-1.0), r"eps", r"-1")
    value_error(lambda: muon_cpp.SimAdEMAMix([p], min_beta_fast=1.5), r"min_beta_fast", r"1.5")
    value_error(lambda: muon_cpp.SimAdEMAMix([p], num_beta_fast_warmup_steps=-2),
                r"num_beta_fast_warmup_steps", r"-2")
    value_error(lambda: muon_cpp.SimAdEMAMix([p], weight_decay_method="palm"),
                r"weight_decay_method", r"palm")
