"""muon_cpp.LaProp and the registry's laprop against the published update.

The reference is NVIDIA-NeMo/Emerging-Optimizers' LaProp written with torch ops
in fp64 (tests/test_laprop.cpp has the C++ side). fp32 parameters: each step
adds a few fp32 roundings (2⁻²⁴ relative), so over 5 steps every value is
within 1e-5 of the largest of its tensor; a missing bias correction, decay or
normalization is off by > 1e-3.
"""
import torch

import muon_cpp
from conftest import assert_matches_reference, leaf, seeded_params, value_error


def ref_laprop_step(s, g, t, lr, beta1, beta2, eps, wd):
    """LaProp as NVIDIA-NeMo/Emerging-Optimizers steps it (calculate_laprop_update in
    emerging_optimizers/scalar_optimizers/update_functions/laprop.py, decoupled decay
    first; arXiv:2002.04839): p ← p·(1 − lr·wd); v ← β2·v + (1 − β2)·g²;
    m ← β1·m + (1 − β1)·g/(√(v/(1 − β2^t)) + ε); p ← p − lr·m/(1 − β1^t)."""
    g = g.to(torch.float64)
    if s.buf is None:
        s.buf, s.v = torch.zeros_like(s.p), torch.zeros_like(s.p)
    s.p = s.p * (1 - lr * wd)
    s.v = beta2 * s.v + (1 - beta2) * g * g
    s.buf = beta1 * s.buf + (1 - beta1) * g / ((s.v / (1 - beta2 ** t)).sqrt() + eps)
    s.p = s.p - lr * s.buf / (1 - beta1 ** t)


def test_laprop_from_make_optimizer_matches_the_published_update():
    gen, named, refs = seeded_params({"w": (5, 7), "tall": (12, 3), "conv": (4, 3, 3, 3),
                                      "b": (6,)})
    opt = muon_cpp.make_optimizer(named, {"optimizer": "laprop", "lr": 0.01, "weight_decay": 0.1,
                                          "laprop_beta1": 0.8, "laprop_beta2": 0.95})
    g0 = opt.param_groups[0]
    assert g0["optimizer"] == "laprop"
    assert (g0["beta1"], g0["beta2"], g0["eps"], g0["correct_bias"]) == (0.8, 0.95, 1e-8, True)
    for t in range(1, 6):
        for n, p in named:
            g = torch.randn(*p.shape, generator=gen)
            p.grad = g.clone()
            ref_laprop_step(refs[n], g, t, 0.01, 0.8, 0.95, 1e-8, 0.1)
        opt.step()
    # fp32 against fp64 over 5 steps: 1e-5 of the largest element (see the top).
    assert_matches_reference(opt, named, refs, {"exp_avg": "buf", "exp_avg_sq": "v"})


def test_laprop_defaults_and_errors():
    p = leaf(torch.randn(3))
    g = muon_cpp.LaProp([p]).param_groups[0]
    assert (g["lr"], g["beta1"], g["beta2"], g["eps"], g["weight_decay"], g["correct_bias"]) == \
        (1e-3, 0.9, 0.999, 1e-8, 0.0, True)
    value_error(lambda: muon_cpp.LaProp([p], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.LaProp([p], beta1=1.0), r"beta1", r"1")
    value_error(lambda: muon_cpp.LaProp([p], eps=-1.0), r"eps", r"-1")
