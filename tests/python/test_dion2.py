"""muon_cpp.Dion2, muon_cpp.NorDion2 and the registry's dion2 / nordion2 against
microsoft/dion's arithmetic.

The reference is dion/dion2.py (dion2_pre_orthogonalize, dion2_post_orthogonalize)
at 00c2bc1b, dion/nordion2.py at 2e9df450 and dion/normuon.py's
_normuon_normalization_core, written with torch ops in fp64, Newton–Schulz in fp64
with the same polar-express coefficients and steps (tests/test_dion2.cpp has the C++
side and the argument for the tolerance: fp32 rounding of the accumulation, of 5
Newton–Schulz steps on small well-conditioned submatrices and of the update stays
below 1e-5 relative; the selection is the same when the norms' gaps are far above
that, which the reference asserts).
"""
import math

import torch

import muon_cpp
from conftest import value_error

FP32_STEP_TOL = 1e-5
POLAR_EXPRESS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def ref_ns(g, eps):
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (x.norm() * 1.02 + eps)
    for a, b, c in POLAR_EXPRESS:
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if g.shape[0] > g.shape[1] else x


class RefDion2:
    """One parameter (a batch of matrices over its last two dims) stepped as Dion does."""

    def __init__(self, p, nordion2, fraction=0.25, ef=0.95, beta2=0.95, eps=1e-8):
        self.x = p.detach().to(torch.float64).clone()
        self.m = torch.zeros_like(self.x)
        self.v = torch.zeros(*self.x.shape[:-1], 1, dtype=torch.float64)
        self.nor, self.fraction, self.ef, self.beta2, self.eps = nordion2, fraction, ef, beta2, eps
        self.min_gap = math.inf

    def step(self, g, lr, wd):
        self.m += g.to(torch.float64)
        rows, cols = self.x.shape[-2:]
        m = self.m.reshape(-1, rows, cols)
        x = self.x.reshape(-1, rows, cols)
        v = self.v.reshape(-1, rows, 1)
        self.x *= 1 - lr * wd
        alr = lr * math.sqrt(rows / cols)
        by_rows = self.nor or rows <= cols
        for b in range(m.shape[0]):
            mb = m[b] if by_rows else m[b].T
            xb = x[b] if by_rows else x[b].T
            n = mb.shape[0]
            k = max(1, math.ceil(self.fraction * n))
            norms = mb.abs().sum(1).tolist()
            order = sorted(range(n), key=lambda i: -norms[i])  # stable: ties to the lower index
            if k < n:
                self.min_gap = min(self.min_gap, (norms[order[k - 1]] - norms[order[k]]) / norms[order[k - 1]])
            sel = sorted(order[:k])
            s = mb[sel].clone()
            mb[sel] *= self.ef
            o = ref_ns(s, self.eps) if by_rows else ref_ns(s.T, self.eps).T
            if self.nor:
                norm_u = o.norm()
                vs = v[b][sel]
                vs = vs + ((o * o).mean(-1, keepdim=True) - vs) * (1 - self.beta2)
                v[b][sel] = vs
                o = o / (vs.sqrt() + 1e-8)
                o = o * (norm_u / o.norm().clamp(min=1e-8))
            xb[sel] -= alr * o


def run_against_reference(opt_of, nordion2, shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    named = [(n, leaf(torch.randn(*s, generator=gen))) for n, s in shapes.items()]
    refs = {n: RefDion2(p, nordion2) for n, p in named}
    opt = opt_of(named)
    for _ in range(5):
        for n, p in named:
            g = torch.randn(*p.shape, generator=gen)
            p.grad = g.clone()
            refs[n].step(g, lr=0.02, wd=0.1)
        opt.step()
    for n, p in named:
        r = refs[n]
        assert r.min_gap > 1e-4, n
        diff = (p.detach().to(torch.float64) - r.x).abs().max().item()
        assert diff <= FP32_STEP_TOL * r.x.abs().max().item(), n
        st = opt.state[p]
        assert int(st["step"]) == 5
        assert st["momentum"].shape == p.shape
        assert (st["momentum"].double() - r.m).abs().max().item() <= FP32_STEP_TOL * r.m.abs().max().item(), n
        if nordion2:
            assert set(st) == {"step", "momentum", "variance"}, n
            assert st["variance"].shape == r.v.shape
            # sqrt(V), the per-row RMS of O the update divides by (V doubles O's relative error).
            got, want = st["variance"].double().sqrt(), r.v.sqrt()
            assert (got - want).abs().max().item() <= FP32_STEP_TOL * want.abs().max().item()
        else:
            assert set(st) == {"step", "momentum"}, n
    return opt


SHAPES = {"w": (6, 10), "tall": (12, 5), "experts": (3, 5, 8)}


def test_dion2_and_nordion2_from_make_optimizer_match_dion():
    for name in ("dion2", "nordion2"):
        opt = run_against_reference(
            lambda named: muon_cpp.make_optimizer(named, {"optimizer": name, "lr": 0.02, "weight_decay": 0.1}),
            name == "nordion2", SHAPES, 3)
        assert opt.param_groups[0]["optimizer"] == name


def test_dion2_classes_match_dion():
    run_against_reference(lambda named: muon_cpp.Dion2([p for _, p in named], lr=0.02, weight_decay=0.1),
                          False, SHAPES, 4)
    run_against_reference(lambda named: muon_cpp.NorDion2([p for _, p in named], lr=0.02, weight_decay=0.1),
                          True, SHAPES, 5)


def test_dion2_is_a_torch_optimizer_with_dions_defaults_and_errors():
    w = leaf(torch.randn(4, 6))
    for cls in (muon_cpp.Dion2, muon_cpp.NorDion2):
        opt = cls([w])
        assert isinstance(opt, torch.optim.Optimizer)
        g = opt.param_groups[0]
        assert (g["lr"], g["fraction"], g["weight_decay"], g["epsilon"], g["adjust_lr"], g["flatten"]) == \
            (0.01, 0.25, 0.01, 1e-8, "spectral_norm", False)
        if cls is muon_cpp.Dion2:
            assert g["ef_decay"] == 0.95
        else:
            assert (g["mu"], g["muon_beta2"]) == (0.95, 0.95)
    assert muon_cpp.Dion2([w], adjust_lr=None).param_groups[0]["adjust_lr"] == "none"
    value_error(lambda: muon_cpp.Dion2([w], lr=-1.0), r"\blr\b", r"-1")
    value_error(lambda: muon_cpp.Dion2([w], fraction=0.0), r"fraction", r"0")
    value_error(lambda: muon_cpp.NorDion2([w], mu=-1.0), r"mu", r"-1")
    value_error(lambda: muon_cpp.Dion2([w], adjust_lr="spectral"), r"adjust_lr", r"spectral")


def test_dion2_state_dict_round_trip_continues_identically():
    for cls in (muon_cpp.Dion2, muon_cpp.NorDion2):
        w = leaf(torch.randn(4, 6))
        opt = cls([w], lr=0.02)
        for _ in range(2):
            w.grad = torch.randn(4, 6)
            opt.step()
        w2 = leaf(w)
        opt2 = cls([w2])
        opt2.load_state_dict(opt.state_dict())
        for _ in range(2):
            g2 = torch.randn(4, 6)
            w.grad, w2.grad = g2.clone(), g2.clone()
            opt.step()
            opt2.step()
        assert torch.equal(w, w2)
