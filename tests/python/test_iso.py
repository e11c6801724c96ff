"""muon_cpp.Iso and the registry's iso against Emerging-Optimizers' arithmetic.

The reference is emerging_optimizers/riemannian_optimizers/isospectral.py at
fd77292 (Iso._init_state, Iso.step and the three retractions), written with torch
ops in fp64. The SVD's singular vectors are defined up to a sign per pair, which
X = U·diag(σ)·Vᵀ does not see: the parameter is compared as it is. Tolerance
(tests/test_iso.cpp derives it): 5·d·u/gap, u = 2^-24, d the longest side, gap the
smallest relative gap between the start's singular values, asserted above 1e-2
here: 5·12·6e-8/1e-2 = 3.6e-4.
"""
import pytest
import torch

import muon_cpp
from conftest import edit_refused_at_step, stepped_matrix_and_bias, value_error

TOL = 3.6e-4


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def retract(y, m, lr, how):
    if how == "cayley":
        d = -m
        skew = d @ y.T - y @ d.T
        eye = torch.eye(y.shape[0], dtype=y.dtype)
        return torch.linalg.solve(eye - 0.5 * lr * skew, (eye + 0.5 * lr * skew) @ y)
    z = y - lr * m
    if how == "polar":
        a, _, bh = torch.linalg.svd(z, full_matrices=False)
        return a @ bh
    q, r = torch.linalg.qr(z)
    signs = torch.diagonal(r).sign()
    signs[signs == 0] = 1
    return q * signs


@pytest.mark.parametrize("retraction", ["qr", "polar", "cayley"])
@pytest.mark.parametrize("shape", [(12, 5), (6, 10), (4, 3, 3)])
def test_follows_emerging_optimizers_arithmetic(shape, retraction):
    torch.manual_seed(5)
    init = torch.randn(shape)
    grads = [torch.randn(shape) for _ in range(5)]
    x = init.double().reshape(shape[0], -1)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    assert ((s[:-1] - s[1:]) / s[0]).min() > 1e-2
    v, mu, mv = vh.T, torch.zeros_like(u), torch.zeros_like(vh.T)
    p = leaf(init)
    opt = muon_cpp.Iso([p], lr=0.01, momentum=0.8, retraction=retraction)
    for g in grads:
        g64 = g.double().reshape(x.shape)
        mu = 0.8 * mu + (g64 @ v) * s
        mv = 0.8 * mv + (g64.T @ u) * s
        u, v = retract(u, mu, 0.01, retraction), retract(v, mv, 0.01, retraction)
        x = (u * s) @ v.T
        p.grad = g.clone()
        opt.step()
    got = p.detach().double().reshape(x.shape)
    assert ((got - x).abs().max() / x.abs().max()).item() < TOL
    st = opt.state[p]
    assert int(st["step"]) == 5
    assert sorted(k for k in st if k != "step") == ["momentum_u", "momentum_v", "sigma", "u", "v"]


def test_registry_entry_and_errors():
    fields = {f["name"]: f["default"] for f in muon_cpp.option_fields("iso")}
    assert fields["momentum"] == 0.9 and fields["retraction"] == "qr"
    assert "iso" in muon_cpp.optimizer_names()
    opt, w, b = stepped_matrix_and_bias({"optimizer": "iso", "lr": 0.01})
    assert opt.state[w]["u"].shape == (8, 4) and "exp_avg" in opt.state[b]
    p = leaf(torch.randn(4, 3))
    value_error(lambda: muon_cpp.Iso([p], retraction="svd"), "retraction", "svd")
    value_error(lambda: muon_cpp.Iso([p], momentum=1.0), "momentum", "1")
    opt = muon_cpp.Iso([p], lr=0.1)
    edit_refused_at_step(opt, p, "weight_decay", 0.1, "weight_decay", "0.1")
