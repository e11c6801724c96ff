"""muon_cpp.Dion and the registry's dion against microsoft/dion's arithmetic.

The reference is dion/dion.py (dion_update_ddp on one process, orthogonalize,
fix_all_zero_or_nan, column_normalize) and dion/dion_reference.py's
power_iteration at 0a059a45, written with torch ops in fp64, Householder QR for
P's orthonormal basis. Dion's Q starts from a seeded draw, so the reference
starts from the optimizer's state after its first step (M and Q) and follows it
for 4 more steps; P·Qᵀ and P·Rᵀ do not depend on the columns' signs, so the
parameter and M are compared as they are and Q up to column signs.
Tolerance: tests/test_dion.cpp derives 5·d·κ·u (u = 2^-24, d the longest side,
κ the condition number of B·Q); these matrices have κ below 50 and d ≤ 12, so
5·12·50·6e-8 = 1.8e-4 bounds the fp32 run's distance.
"""
import math

import pytest
import torch

import muon_cpp
from conftest import edit_refused_at_step, stepped_matrix_and_bias, value_error

TOL = 1.8e-4


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def ref_step(x, m, q, g, lr, wd, mu, eps, power_iters=1):
    rows, cols = x.shape[0], x.numel() // x.shape[0]
    m += g.reshape(rows, cols).to(torch.float64)
    transposed = rows < cols
    b = m.T if transposed else m
    q_old, r = q, q
    for _ in range(power_iters):
        bq = b @ r
        sv = torch.linalg.svdvals(bq)
        assert (sv.max() / sv.min()).item() < 50
        p = torch.linalg.qr(bq).Q
        r = b.T @ p
    if bool((b == 0).all()):
        p, r = torch.zeros_like(p), q_old
    pr = p @ r.T
    m -= (1 - mu) * (pr.T if transposed else pr)
    q = r / (r.norm(dim=0, keepdim=True) + eps)
    u = p @ q.T
    x = x * (1 - lr * wd) - lr * math.sqrt(rows / cols) * (u.T if transposed else u).reshape(x.shape)
    return x, m, q


def relative(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def signs_aligned(got, want):
    s = (got.double() * want).sum(0, keepdim=True).sign()
    return got.double() * torch.where(s == 0, torch.ones_like(s), s)


@pytest.mark.parametrize("shape,options", [
    ((12, 5), {}),
    ((6, 10), {"mu": 0.9}),
    ((4, 3, 3), {"qr_method": "qr"}),
    ((10, 8), {"rank_fraction": 0.5, "power_iters": 2}),
])
def test_follows_dions_arithmetic(shape, options):
    torch.manual_seed(3)
    p = leaf(torch.randn(shape))
    grads = [torch.randn(shape) for _ in range(5)]
    opt = muon_cpp.Dion([p], lr=0.02, weight_decay=0.1, **options)
    p.grad = grads[0].clone()
    opt.step()
    st = opt.state[p]
    assert sorted(k for k in st if k != "step") == ["Q", "momentum"]
    x = p.detach().double().clone()
    m = st["momentum"].double().reshape(shape[0], -1).clone()
    q = st["Q"].double().clone()
    for g in grads[1:]:
        x, m, q = ref_step(x, m, q, g, 0.02, 0.1, options.get("mu", 0.95), 1e-8,
                           options.get("power_iters", 1))
        p.grad = g.clone()
        opt.step()
    assert int(st["step"]) == 5
    assert relative(p.detach(), x) < TOL
    assert relative(st["momentum"].reshape(m.shape), m) < TOL
    assert relative(signs_aligned(st["Q"], q), q) < TOL


def test_defaults_and_config_fields():
    fields = {f["name"]: f["default"] for f in muon_cpp.option_fields("dion")}
    assert fields["mu"] == 0.95 and fields["rank_fraction"] == 1.0
    assert fields["qr_method"] == "rcqr" and fields["rcqr_oversample"] == 1.25
    assert "dion" in muon_cpp.optimizer_names()
    opt, w, b = stepped_matrix_and_bias({"optimizer": "dion", "lr": 0.01, "dion_rank_fraction": 0.5})
    assert opt.state[w]["Q"].shape == (4, 2)
    assert "exp_avg" in opt.state[b]  # the bias goes to AdamW, as Dion's "adamw" groups


def test_bad_options_name_the_argument_and_change_nothing():
    p = leaf(torch.randn(4, 3))
    value_error(lambda: muon_cpp.Dion([p], rank_fraction=1.5), "rank_fraction", "1.5")
    value_error(lambda: muon_cpp.Dion([p], qr_method="cqr"), "qr_method", "cqr")
    opt = muon_cpp.Dion([p], lr=0.1)
    edit_refused_at_step(opt, p, "mu", -1.0, "mu", "-1")
