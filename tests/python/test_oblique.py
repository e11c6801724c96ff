"""muon_cpp.ObliqueSGD / ObliqueAdam and the registry's oblique_sgd / oblique_adam
against the published update.

The reference is NVIDIA-NeMo/Emerging-Optimizers' ObliqueSGD and ObliqueAdam
(emerging_optimizers/riemannian_optimizers/normalized_optimizer.py at commit
fd77292, weight decay by WeightDecayMixin in emerging_optimizers/mixin.py)
written with plain torch ops in fp64; tests/test_oblique.cpp has the C++ side.
fp32 parameters: each step rounds p and the moments a few times per element
(2⁻²⁴ relative each), plus sums along dim of at most 12 products, so over 5
steps every value is within 1e-5 of the largest of its tensor; a missing
projection, decay or retraction is off by > 1e-3.
"""
import pytest
import torch

import muon_cpp

SHAPES = {"w": (5, 7), "tall": (12, 3), "conv": (4, 3, 3, 3)}
TOL = 1e-5


def ref_project_step_retract(p, u, lr, wd, method, dim, eps):
    r = u - p * (p * u).sum(dim=dim, keepdim=True)
    if wd != 0:
        if method == "decoupled":
            p = p - lr * wd * p
        elif method == "independent":
            p = p - wd * p
        else:
            r = r + wd * p
    p = p - lr * r
    return p / p.norm(dim=dim, keepdim=True).clamp_min(eps)


def ref_sgd(p, grads, lr, momentum, wd, method, dim, eps):
    buf = torch.zeros_like(p)
    for g in grads:
        buf = g + momentum * buf
        p = ref_project_step_retract(p, buf, lr, wd, method, dim, eps)
    return p


def ref_adam(p, grads, lr, b1, b2, wd, method, dim, eps, correct_bias):
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        c1 = 1 - b1 ** t if correct_bias else 1.0
        c2 = 1 - b2 ** t if correct_bias else 1.0
        # √v over c2, not √c2: the published arithmetic.
        p = ref_project_step_retract(p, (m / c1) / (v.sqrt() / c2 + eps), lr, wd, method, dim, eps)
    return p


def run(make, steps=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    named = [(n, torch.randn(s, generator=gen).requires_grad_()) for n, s in SHAPES.items()]
    init = {n: p.detach().double().clone() for n, p in named}
    grads = {n: [torch.randn(p.shape, generator=gen) for _ in range(steps)] for n, p in named}
    opt = make(named)
    for k in range(steps):
        for n, p in named:
            p.grad = grads[n][k].clone()
        opt.step()
    return named, init, {n: [g.double() for g in gs] for n, gs in grads.items()}


def assert_close(got, want):
    err = (got.detach().double() - want).abs().max() / want.abs().max()
    assert err <= TOL, err.item()


@pytest.mark.parametrize("method", ["decoupled", "independent", "l2"])
@pytest.mark.parametrize("dim", [0, 1])
def test_oblique_sgd_matches_the_published_update(method, dim):
    named, init, grads = run(lambda named: muon_cpp.ObliqueSGD(
        [p for _, p in named], lr=0.05, momentum=0.8, weight_decay=0.1,
        weight_decay_method=method, dim=dim))
    for n, p in named:
        assert_close(p, ref_sgd(init[n], grads[n], 0.05, 0.8, 0.1, method, dim, 1e-8))
        norms = p.detach().norm(dim=dim)
        assert torch.allclose(norms, torch.ones_like(norms), rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ["decoupled", "independent", "l2"])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("correct_bias", [True, False])
def test_oblique_adam_matches_the_published_update(method, dim, correct_bias):
    named, init, grads = run(lambda named: muon_cpp.ObliqueAdam(
        [p for _, p in named], lr=0.05, betas=(0.8, 0.95), weight_decay=0.1,
        weight_decay_method=method, dim=dim, correct_bias=correct_bias))
    for n, p in named:
        assert_close(p, ref_adam(init[n], grads[n], 0.05, 0.8, 0.95, 0.1, method, dim, 1e-8,
                                 correct_bias))


def test_make_optimizer_and_names():
    assert "oblique_sgd" in muon_cpp.optimizer_names()
    assert "oblique_adam" in muon_cpp.optimizer_names()
    named, init, grads = run(lambda named: muon_cpp.make_optimizer(named, {
        "optimizer": "oblique_adam", "lr": 0.05, "weight_decay": 0.1,
        "oblique_adam_beta1": 0.8, "oblique_adam_beta2": 0.95, "oblique_adam_dim": 1,
        "oblique_adam_weight_decay_method": "independent"}))
    for n, p in named:
        assert_close(p, ref_adam(init[n], grads[n], 0.05, 0.8, 0.95, 0.1, "independent", 1, 1e-8,
                                 True))
    named, init, grads = run(lambda named: muon_cpp.make_optimizer(named, {
        "optimizer": "oblique_sgd", "lr": 0.05, "oblique_sgd_momentum": 0.5}))
    for n, p in named:
        assert_close(p, ref_sgd(init[n], grads[n], 0.05, 0.5, 0.0, "decoupled", 0, 1e-8))


def test_bad_options_are_refused_by_name():
    w = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(ValueError, match=r"eps"):
        muon_cpp.ObliqueSGD([w], eps=0.0)
    with pytest.raises(ValueError, match=r"lr"):
        muon_cpp.ObliqueAdam([w], lr=-1.0)
    with pytest.raises(ValueError, match=r"betas"):
        muon_cpp.ObliqueAdam([w], betas=0.9)
    opt = muon_cpp.ObliqueSGD([w], dim=2)
    w.grad = torch.randn(4, 3)
    before = w.detach().clone()
    with pytest.raises(ValueError, match=r"dim.*got 2"):
        opt.step()
    assert torch.equal(w.detach(), before)
