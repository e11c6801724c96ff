"""A step happens whole or changes nothing; large finite gradients; ranges.

The C++ side (tests/test_whole_step.cpp) injects a failure at every fault point
of every registered optimizer's step; here the two failures met in use: SOAP's
eigh on gradients of 1e20 and MOP's SVD on a NaN gradient under
nonfinite=propagate raise ValueError and leave parameters and state as they
were. LaProp on gradients of 1e20 follows an fp64 run of its update (g²
overflows fp32, the second moment does not); option values whose arithmetic
makes NaN from finite gradients are refused by name (tests/test_large_gradients.cpp).
"""
import math

import torch

import muon_cpp
from conftest import value_error


def named_params():
    torch.manual_seed(3)
    return [("fc.weight", torch.randn(8, 6, requires_grad=True)),
            ("fc.bias", torch.randn(8, requires_grad=True)),
            ("fc_out.weight", torch.randn(6, 8, requires_grad=True))]


def set_grads(named, seed, scale=1.0):
    torch.manual_seed(seed)
    for _, p in named:
        p.grad = torch.randn_like(p) * scale


def snapshot(named, opt):
    params = [p.detach().clone() for _, p in named]
    state = {k: (v.clone() if torch.is_tensor(v) else v)
             for i, s in opt.state_dict()["state"].items() for k, v in
             ((f"{i}/{name}", value) for name, value in s.items())}
    return params, state


def assert_same(a, b):
    for x, y in zip(a[0], b[0]):
        assert torch.equal(x, y)
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        x, y = a[1][k], b[1][k]
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, k


def test_soap_eigh_failure_on_huge_gradients_changes_nothing():
    named = named_params()
    opt = muon_cpp.make_optimizer(named, {"optimizer": "soap", "lr": 0.01})
    set_grads(named, 5)
    opt.step()
    set_grads(named, 6, 1e20)
    before = snapshot(named, opt)
    value_error(opt.step, r"\[muon::Soap\]", r"shape \[8, 6\]", r"nothing of this step was applied")
    assert_same(before, snapshot(named, opt))
    set_grads(named, 7)
    opt.step()
    assert all(torch.isfinite(p).all() for _, p in named)


def mop_before_a_nan_gradient():
    """MOP under nonfinite=propagate after one step, with a NaN in the next gradient."""
    named = named_params()
    opt = muon_cpp.make_optimizer(named, {"optimizer": "mop", "lr": 0.01, "nonfinite": "propagate"})
    set_grads(named, 5)
    opt.step()
    set_grads(named, 6)
    named[0][1].grad[0, 0] = float("nan")
    return named, opt


def test_mop_svd_failure_on_a_nan_gradient_changes_nothing():
    named, opt = mop_before_a_nan_gradient()
    before = snapshot(named, opt)
    value_error(opt.step, r"\[muon::MOP\]", r"SVD", r"nothing of this step was applied")
    assert_same(before, snapshot(named, opt))


def test_whole_steps_off_still_names_the_failure_and_says_parts_may_be_applied():
    assert muon_cpp.whole_steps()
    _, opt = mop_before_a_nan_gradient()
    muon_cpp.set_whole_steps(False)
    try:
        assert not muon_cpp.whole_steps()
        value_error(opt.step, r"\[muon::MOP\]", r"SVD", r"parts of this step may be applied")
    finally:
        muon_cpp.set_whole_steps(True)
    assert muon_cpp.whole_steps()


def test_laprop_follows_the_fp64_update_on_gradients_of_1e20():
    torch.manual_seed(1)
    p = torch.randn(64, requires_grad=True)
    ref = p.detach().double().clone()
    m = torch.zeros_like(ref)
    v = torch.zeros_like(ref)
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
    opt = muon_cpp.LaProp([p], lr=lr, weight_decay=0.0)
    group = opt.param_groups[0]
    assert (group["beta1"], group["beta2"], group["eps"]) == (b1, b2, eps)
    for t in range(1, 4):
        g = torch.randn(64) * 1e20
        p.grad = g.clone()
        opt.step()
        gd = g.double()
        v = b2 * v + (1 - b2) * gd * gd
        m = b1 * m + (1 - b1) * gd / ((v / (1 - b2 ** t)).sqrt() + eps)
        ref = ref - lr * m / (1 - b1 ** t)
        assert torch.isfinite(p).all()
        # ~20 fp32 roundings per step on values of at most |p| + lr, three steps.
        bound = 3 * 20 * 2.0 ** -24 * (ref.abs() + lr)
        assert ((p.detach().double() - ref).abs() <= bound).all(), t


def test_values_that_make_nan_from_finite_gradients_are_refused_by_name():
    w = torch.randn(4, 4, requires_grad=True)
    value_error(lambda: muon_cpp.LaProp([w], eps=0.0), r"\beps\b", r"got 0")
    value_error(lambda: muon_cpp.SimAdEMAMix([w], eps=0.0), r"\beps\b", r"got 0")
    value_error(lambda: muon_cpp.SOAP([w], eps=0.0), r"\beps\b", r"got 0")
    value_error(lambda: muon_cpp.NorDion2([w], muon_beta2=1.5), r"muon_beta2", r"1\.5")
    value_error(lambda: muon_cpp.Dion2([w], ef_decay=1e6), r"ef_decay", r"1e\+06")
    value_error(lambda: muon_cpp.NorDion2([w], mu=1.5), r"\bmu\b", r"1\.5")
    named = named_params()
    for field, value in [("laprop_eps", 0.0), ("sim_ademamix_eps", 0.0), ("soap_eps", 0.0),
                         ("nordion2_muon_beta2", 1.5), ("dion2_ef_decay", 1e6), ("nordion2_mu", 1.5)]:
        optimizer = "sim_ademamix" if field.startswith("sim_") else field.split("_")[0]
        value_error(lambda: muon_cpp.make_optimizer(named, {"optimizer": optimizer, field: value}),
                    field)
    # An edit after construction is refused at the step, and nothing changes.
    p = torch.randn(4, 4, requires_grad=True)
    opt = muon_cpp.LaProp([p], lr=0.01)
    p.grad = torch.zeros(4, 4)
    opt.step()
    before = p.detach().clone()
    opt.param_groups[0]["eps"] = 0.0
    value_error(opt.step, r"\beps\b", r"got 0")
    assert torch.equal(before, p.detach())
    assert math.isclose(opt.param_groups[0]["lr"], 0.01)
