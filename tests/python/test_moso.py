"""muon_cpp.MOSO and the registry's moso against Emerging-Optimizers' arithmetic.

The reference is emerging_optimizers/legacy_soap/moso.py at fd77292 (MOSO.step,
the one-sided covariance, eigh at the first step and one orthogonal iteration
after it, sorted by diag(QᵀMQ) with v left in place, RMSprop in the eigenbasis,
_clip_update_rms_in_place, decoupled weight decay), written with torch ops in
fp64. Tolerance (tests/test_moso.cpp derives it): 1e-5 relative, for inputs
whose covariance keeps every eigenvalue gap above 1% of the largest (asserted):
the fp32 eigenbasis then carries < 2^-24/0.01 ≈ 6e-6 relative error.
"""
import pytest
import torch

import muon_cpp
from conftest import edit_refused_at_step, stepped_matrix_and_bias, value_error

TOL = 1e-5


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def relative(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def reference(init, grads, lr, momentum, rms_beta, shampoo_beta, eps, wd, max_rms):
    p = init.double().reshape(init.shape[0], -1).clone()
    left = p.shape[0] <= p.shape[1]
    k = min(p.shape)
    b, v = torch.zeros_like(p), torch.zeros_like(p)
    m, q = torch.zeros(k, k, dtype=torch.float64), torch.eye(k, dtype=torch.float64)
    min_gap = 1.0
    for t, g in enumerate(grads, start=1):
        g = g.double().reshape(p.shape)
        p = p - lr * wd * p
        b = momentum * b + (1 - momentum) * g
        beta = 1 - (1 - shampoo_beta) / (1 - shampoo_beta ** t)
        x = b if left else b.T
        m = beta * m + (1 - beta) * (x @ x.T)
        w = torch.linalg.eigvalsh(m)
        min_gap = min(min_gap, ((w[1:] - w[:-1]).min() / w.abs().max()).item())
        if t == 1:
            q = torch.linalg.eigh(m)[1].flip(-1)
        else:
            q = torch.linalg.qr(m @ q).Q
            q = q[:, torch.argsort(((q.T @ m) * q.T).sum(1), descending=True)]
        proj = q.T @ b if left else b @ q
        v = rms_beta * v + (1 - rms_beta) * proj ** 2
        r = proj / (v.sqrt() + eps)
        u = q @ r if left else r @ q.T
        if max_rms > 0:
            u = u * min(1.0, max_rms / (u.square().mean().sqrt().item() + 1e-7))
        p = p - lr * u
    return p, b, m, v, min_gap


@pytest.mark.parametrize("max_rms", [0.0, 0.5])
@pytest.mark.parametrize("shape", [(5, 8), (9, 4), (6, 2, 4)])
def test_follows_emerging_optimizers_arithmetic(shape, max_rms):
    torch.manual_seed(11)
    init = torch.randn(shape)
    grads = [torch.randn(shape) for _ in range(5)]
    p = leaf(init)
    opt = muon_cpp.MOSO([p], lr=0.01, momentum=0.9, rms_beta=0.9, shampoo_beta=0.8, weight_decay=0.1,
                        max_update_rms=max_rms)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want, b, m, v, gap = reference(init, grads, 0.01, 0.9, 0.9, 0.8, 1e-8, 0.1, max_rms)
    assert gap > 0.01
    start = init.double().reshape(want.shape)
    assert relative(p.detach().reshape(want.shape) - start, want - start) < TOL
    st = opt.state[p]
    assert int(st["step"]) == 5
    assert sorted(k for k in st if k != "step") == ["M", "Q_M", "exp_avg_sq", "momentum_buffer"]
    assert relative(st["momentum_buffer"], b) < TOL
    assert relative(st["M"], m) < TOL
    assert relative(st["exp_avg_sq"], v) < TOL


def test_registry_entry_and_errors():
    fields = {f["name"]: f["default"] for f in muon_cpp.option_fields("moso")}
    assert fields["momentum"] == 0.95 and fields["rms_beta"] == 0.95 and fields["shampoo_beta"] == 0.95
    assert fields["eps"] == 1e-8 and fields["max_update_rms"] == 0.0
    assert "moso" in muon_cpp.optimizer_names()
    opt, w, b = stepped_matrix_and_bias({"optimizer": "moso", "lr": 0.01})
    assert opt.state[w]["Q_M"].shape == (4, 4) and "exp_avg" in opt.state[b]
    p = leaf(torch.randn(4, 3))
    value_error(lambda: muon_cpp.MOSO([p], rms_beta=1.0), "rms_beta", "1")
    value_error(lambda: muon_cpp.MOSO([p], eps=0.0), "eps", "0")
    opt = muon_cpp.MOSO([p], lr=0.1)
    edit_refused_at_step(opt, p, "momentum", -0.5, "momentum", "-0.5")
    assert len(opt.state[p]) == 0 or int(opt.state[p].get("step", 0)) == 0
