"""muon_cpp's KL-SOAP family (KlSoap, KlMSoap, REKLS, ReklsV3, StackedSoap) and
its registry entries against Emerging-Optimizers' arithmetic.

The reference is emerging_optimizers/shampoo/soap_v3.py and legacy_soap/
(soap.py update_kronecker_factors_kl_shampoo, rekls.py, stacked_soap.py) with
utils/eig.py at fd77292, written with torch ops in fp64, and the optimizers run
on fp64 parameters (their state is then fp64). eps is 1: the first step's bases
diagonalize the gradient, and the inner step divides the off-diagonal rounding by
eps (tests/test_kl_soap.cpp explains it). Tolerance, as that file derives it:
5·d·2^-53/gap, d the longest side, gap the smallest relative gap between a
factor's eigenvalues, asserted above 1e-3: 5·6·1.1e-16/1e-3 ≈ 3.3e-12.
"""
import pytest
import torch

import muon_cpp
from conftest import stepped_matrix_and_bias, value_error

CLASSES = {"kl_soap": muon_cpp.KlSoap, "rekls": muon_cpp.REKLS, "rekls_v3": muon_cpp.ReklsV3,
           "stacked_soap": muon_cpp.StackedSoap, "tp_rekls": muon_cpp.TpRekls}


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def reference(kind, init, grads, lr, betas, shampoo_beta, eps, wd):
    shape = init.shape

    def matrix(x):
        if kind == "stacked_soap" and len(shape) == 3:
            b, m, n = shape
            return x.permute(1, 0, 2).reshape(m, b * n) if n <= m else x.reshape(b * m, n)
        return x.reshape(shape[0], -1)

    def unmatrix(x):
        if kind == "stacked_soap" and len(shape) == 3 and shape[2] <= shape[1]:
            return x.reshape(shape[1], shape[0], shape[2]).permute(1, 0, 2).reshape(shape)
        return x.reshape(shape)

    p = init.double()
    rows, cols = matrix(p).shape
    m, v = torch.zeros(rows, cols, dtype=torch.float64), torch.zeros(rows, cols, dtype=torch.float64)
    L, R = torch.zeros(rows, rows, dtype=torch.float64), torch.zeros(cols, cols, dtype=torch.float64)
    QL, QR = torch.eye(rows, dtype=torch.float64), torch.eye(cols, dtype=torch.float64)
    wL, wR = torch.zeros(rows, dtype=torch.float64), torch.zeros(cols, dtype=torch.float64)
    gap = 1.0
    for t, grad in enumerate(grads, start=1):
        g = matrix(grad.double())
        bs = 1 - (1 - shampoo_beta) / (1 - shampoo_beta ** t)
        corr = lambda q, w, d: (q * (1 / d / w.clamp_min(eps))) @ q.T  # noqa: E731
        to_l = g @ corr(QR, wR, g.shape[1]) @ g.T
        to_r = g.T @ corr(QL, wL, g.shape[0]) @ g
        L, R = bs * L + (1 - bs) * to_l, bs * R + (1 - bs) * to_r
        mom = QL @ m @ QR.T
        new = []
        for k, q in ((L, QL), (R, QR)):
            w, vecs = torch.linalg.eigh(k)
            big = w[w > 1e-10 * w.abs().max()]
            if big.numel() > 1:
                gap = min(gap, ((big[1:] - big[:-1]).min() / big.abs().max()).item())
            if t == 1 or kind in ("rekls", "rekls_v3", "tp_rekls"):
                new.append((w.flip(0), vecs.flip(1)))
            else:
                q = torch.linalg.qr(k @ q).Q
                d = ((q.T @ k) * q.T).sum(1)
                order = torch.argsort(d, descending=True)
                new.append((d[order], q[:, order]))
        (wL, QL), (wR, QR) = new
        m = QL.T @ mom @ QR
        gp = QL.T @ g @ QR
        m = betas[0] * m + (1 - betas[0]) * gp
        v = betas[1] * v + (1 - betas[1]) * gp ** 2
        u = (m / (1 - betas[0] ** t)) / ((v / (1 - betas[1] ** t)).sqrt() + eps)
        pm = matrix(p)
        p = unmatrix(pm - lr * wd * pm - lr * QL @ u @ QR.T)
    return p, L, R, gap


# Square matrices: 2-D, conv (6, 3, 2) as one 6×6 matrix, and stacked_soap's
# experts (2, 3, 6) as (2·3, 6). A tall or wide matrix's larger factor starts
# with a null space whose basis rounding picks (tests/test_kl_soap.cpp).
CASES = [(kind, (6, 6)) for kind in sorted(CLASSES)] + [
    (kind, (6, 3, 2)) for kind in ("kl_soap", "rekls", "rekls_v3")] + [("stacked_soap", (2, 3, 6))]


@pytest.mark.parametrize("kind,shape", CASES)
def test_follows_emerging_optimizers_arithmetic(kind, shape):
    torch.manual_seed(3)
    init = torch.randn(shape, dtype=torch.float64)
    grads = [torch.randn(shape, dtype=torch.float64) for _ in range(5)]
    p = leaf(init)
    opt = CLASSES[kind]([p], lr=0.01, betas=(0.8, 0.9), shampoo_beta=0.9, eps=1.0, weight_decay=0.1)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want, L, R, gap = reference(kind, init, grads, 0.01, (0.8, 0.9), 0.9, 1.0, 0.1)
    assert gap > 1e-3
    tol = 5 * max(L.shape[0], R.shape[0]) * 2.0 ** -53 / gap
    change = (p.detach() - init).double()
    assert ((change - (want - init)).norm() / (want - init).norm()).item() < tol
    st = opt.state[p]
    assert int(st["step"]) == 5
    assert ((st["L"] - L).norm() / L.norm()).item() < tol
    assert sorted(k for k in st if k != "step") == sorted(
        ["exp_avg", "exp_avg_sq", "L", "R", "Q_L", "Q_R", "eigvals_L", "eigvals_R"])


def test_registry_entries_and_errors():
    names = muon_cpp.optimizer_names()
    for kind in ("kl_soap", "kl_m_soap", "rekls", "tp_rekls", "rekls_v3", "stacked_soap"):
        assert kind in names
        fields = {f["name"]: f["default"] for f in muon_cpp.option_fields(kind)}
        assert fields["beta1"] == 0.9 and fields["beta2"] == 0.95 and fields["shampoo_beta"] == 0.95
        assert ("weight_decay_method" in fields) == (kind in ("rekls", "tp_rekls"))
    opt, w, b = stepped_matrix_and_bias({"optimizer": "kl_m_soap", "lr": 0.01})
    assert opt.state[w]["Q_L"].shape == (8, 8) and "exp_avg" in opt.state[b]
    p = leaf(torch.randn(4, 3))
    value_error(lambda: muon_cpp.KlSoap([p], betas=(1.0, 0.9)), "beta1", "1")
    value_error(lambda: muon_cpp.KlSoap([p], eps=0.0), "eps", "0")
    value_error(lambda: muon_cpp.REKLS([p], weight_decay_method="palm"), "weight_decay_method", "palm")
    opt = muon_cpp.StackedSoap([leaf(torch.randn(2, 2, 2, 2))])
    q = opt.param_groups[0]["params"][0]
    q.grad = torch.ones_like(q)
    before = q.detach().clone()
    value_error(opt.step, "4 dims", "stacked_soap")
    assert torch.equal(q.detach(), before)
