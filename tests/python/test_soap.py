"""muon_cpp.SOAP and the registry's soap against Emerging-Optimizers' SOAP.

The reference is NVIDIA-NeMo/Emerging-Optimizers' SOAP (emerging_optimizers/soap/
soap.py and soap_utils.py at 18adc0bb, utils/eig.py at fc96b03c) written with torch
ops in fp64 (tests/test_soap.cpp has the C++ side and the full argument). The first
eigenbasis comes at step 3 (adam_warmup_steps 2), when every factor has full rank:
a repeated eigenvalue would leave the basis free to rotate, and Adam is not
rotation invariant. Sign flips of eigenvectors cancel, so the parameters compare
directly: fp32 rounding of O(10-100) operations per element, and eigenvector errors
of about 2^-24 · ||K|| / gap with every gap above 1% of ||K|| (about 6e-6), stay below 1e-5.
"""
import torch

import muon_cpp
from conftest import value_error

FP32_STEP_TOL = 1e-5


def leaf(t):
    return t.detach().clone().requires_grad_(True)


class RefSoap:
    """One parameter (as the m×n matrix) stepped as Emerging-Optimizers' SOAP.step does."""

    def __init__(self, p):
        self.p = p.detach().to(torch.float64).reshape(p.shape[0], -1).clone()
        m, n = self.p.shape
        self.m, self.v = torch.zeros_like(self.p), torch.zeros_like(self.p)
        self.L, self.R = torch.zeros(m, m, dtype=torch.float64), torch.zeros(n, n, dtype=torch.float64)
        self.QL = self.QR = None
        self.s = 0

    @staticmethod
    def qr_refresh(k, q, v, axis):
        order = torch.argsort((q.T @ k * q.T).sum(1), descending=True)
        return torch.linalg.qr(k @ q[:, order]).Q, v.index_select(axis, order)

    def step(self, g, lr, b1, b2, bs, eps, wd, freq, warm):
        g = g.to(torch.float64).reshape(self.p.shape)
        t = self.s + 1
        bsc = 1 - (1 - bs) / (1 - bs ** t)
        self.L = bsc * self.L + (1 - bsc) * g @ g.T
        self.R = bsc * self.R + (1 - bsc) * g.T @ g
        if self.s >= warm and (self.s == warm or self.s % freq == 0):
            mom = self.QL @ self.m @ self.QR.T if self.QL is not None else self.m
            if self.s == warm:
                self.QL = torch.linalg.eigh(self.L).eigenvectors.flip(-1)
                self.QR = torch.linalg.eigh(self.R).eigenvectors.flip(-1)
            else:
                self.QL, self.v = self.qr_refresh(self.L, self.QL, self.v, 0)
                self.QR, self.v = self.qr_refresh(self.R, self.QR, self.v, 1)
            self.m = self.QL.T @ mom @ self.QR
        self.p = self.p - lr * wd * self.p
        pre = self.s >= warm
        gp = self.QL.T @ g @ self.QR if pre else g
        self.m = b1 * self.m + (1 - b1) * gp
        self.v = b2 * self.v + (1 - b2) * gp * gp
        u = (self.m / (1 - b1 ** t)) / ((self.v / (1 - b2 ** t)).sqrt() + eps)
        if pre:
            u = self.QL @ u @ self.QR.T
        self.p = self.p - lr * u
        self.s += 1


def test_soap_from_make_optimizer_matches_emerging_optimizers():
    gen = torch.Generator().manual_seed(3)
    shapes = {"w": (5, 8), "tall": (8, 5), "conv": (6, 2, 2, 2)}
    named = [(n, leaf(torch.randn(*s, generator=gen))) for n, s in shapes.items()]
    refs = {n: RefSoap(p) for n, p in named}
    hyper = dict(lr=0.01, b1=0.9, b2=0.95, bs=0.95, eps=1e-8, wd=0.1, freq=2, warm=2)
    opt = muon_cpp.make_optimizer(named, {"optimizer": "soap", "lr": 0.01, "weight_decay": 0.1,
                                          "soap_precondition_frequency": 2,
                                          "soap_adam_warmup_steps": 2})
    g0 = opt.param_groups[0]
    assert g0["optimizer"] == "soap"
    assert (g0["beta1"], g0["beta2"], g0["shampoo_beta"], g0["precondition_frequency"]) == (0.9, 0.95, 0.95, 2)
    for _ in range(5):
        for n, p in named:
            g = torch.randn(*p.shape, generator=gen)
            p.grad = g.clone()
            refs[n].step(g, **hyper)
        opt.step()
    for n, p in named:
        r = refs[n]
        diff = (p.detach().to(torch.float64).reshape(r.p.shape) - r.p).abs().max().item()
        assert diff <= FP32_STEP_TOL * r.p.abs().max().item(), n
        st = opt.state[p]
        assert set(st) == {"step", "exp_avg", "exp_avg_sq", "L", "R", "Q_L", "Q_R"}, n
        assert int(st["step"]) == 5
        assert st["L"].shape == r.L.shape and st["Q_R"].shape == r.R.shape
        assert (st["L"].double() - r.L).abs().max().item() <= FP32_STEP_TOL * r.L.abs().max().item(), n


def test_soap_is_a_torch_optimizer_with_defaults_and_errors():
    w = leaf(torch.randn(4, 3))
    opt = muon_cpp.SOAP([w])
    assert isinstance(opt, torch.optim.Optimizer)
    g = opt.param_groups[0]
    assert (g["lr"], g["beta1"], g["beta2"], g["shampoo_beta"], g["eps"], g["weight_decay"]) == \
        (3e-3, 0.9, 0.95, 0.95, 1e-8, 0.01)
    assert (g["weight_decay_method"], g["precondition_frequency"], g["adam_warmup_steps"]) == \
        ("decoupled", 1, 0)
    value_error(lambda: muon_cpp.SOAP([w], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.SOAP([w], shampoo_beta=1.0), r"shampoo_beta", r"1")
    value_error(lambda: muon_cpp.SOAP([w], precondition_frequency=0), r"precondition_frequency", r"0")
    # A step, then a state_dict round trip into a fresh optimizer continues identically.
    w.grad = torch.randn(4, 3)
    opt.step()
    w2 = leaf(w)
    opt2 = muon_cpp.SOAP([w2])
    opt2.load_state_dict(opt.state_dict())
    g2 = torch.randn(4, 3)
    w.grad, w2.grad = g2.clone(), g2.clone()
    opt.step()
    opt2.step()
    assert torch.equal(w, w2)
