"""muon_cpp.Muon with weight_decay_mode="cautious" (docs/optimizer.md): decay
only where the update and the weight agree in sign, p ← p − lr·wd·p·[p·u >= 0]
− lr·u with u the scaled orthogonalized update (microsoft/dion's
muon_update_post_orthogonalize), against the formula in fp64 over 5 steps;
the keyword in the param groups and the state dict; the other Muon-family
classes take it."""
import math

import torch

import muon_cpp
from conftest import leaf, max_diff, ref_newton_schulz, schedule_of, within_fp32_steps


def ref_step(p, buf, g, lr, wd, mu=0.95):
    """EMA momentum, Nesterov, quintic Newton–Schulz, shape_scaling, then the
    cautious decay and the update, all in fp64. Returns the scaled update."""
    g = g.to(torch.float64)
    buf.mul_(mu).add_((1 - mu) * g)
    u = (1 - mu) * g + mu * buf
    rows, cols = u.shape
    o = ref_newton_schulz(u, schedule_of("quintic")) * math.sqrt(max(1.0, rows / cols))
    mask = (p * o >= 0).to(torch.float64)
    p.sub_(lr * wd * p * mask + lr * o)
    return o


def test_matches_the_formula_over_five_steps():
    gen = torch.Generator().manual_seed(3)
    shapes = [(12, 8), (8, 12), (10, 10)]
    params = [leaf(torch.randn(*s, generator=gen)) for s in shapes]
    refs = [p.detach().to(torch.float64).clone() for p in params]
    bufs = [torch.zeros_like(r) for r in refs]
    lr, wd = 0.02, 0.5
    opt = muon_cpp.Muon(params, lr=lr, weight_decay=wd, weight_decay_mode="cautious")
    margin = 1.0
    for _ in range(5):
        for p, r, b in zip(params, refs, bufs):
            g = torch.randn(*p.shape, generator=gen)
            p.grad = g.clone()
            before = r.clone()
            o = ref_step(r, b, g, lr, wd)
            margin = min(margin, (o.abs().min() / o.abs().max()).item(),
                         (before.abs().min() / before.abs().max()).item())
        opt.step()
    # fp32 against fp64: ~1e-6 of the parameters after five steps on any CPU
    # (tests/test_muon_cautious.cpp says why); the masks agree because no
    # decisive entry comes within 1e-5 of its largest, far beyond that error.
    assert margin > 1e-5
    for p, r in zip(params, refs):
        assert within_fp32_steps(p, r)


def test_keyword_in_groups_and_state_dict_and_the_family():
    gen = torch.Generator().manual_seed(4)
    p = leaf(torch.randn(8, 6, generator=gen))
    opt = muon_cpp.Muon([p], lr=0.02, weight_decay=0.5, weight_decay_mode="cautious")
    assert opt.param_groups[0]["weight_decay_mode"] == "cautious"
    p.grad = torch.randn(8, 6, generator=gen)
    opt.step()
    sd = opt.state_dict()
    assert sd["param_groups"][0]["weight_decay_mode"] == "cautious"
    q = leaf(p)
    other = muon_cpp.Muon([q], lr=0.02, weight_decay=0.5)
    other.load_state_dict(sd)
    assert other.param_groups[0]["weight_decay_mode"] == "cautious"
    g = torch.randn(8, 6, generator=gen)
    p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    other.step()
    assert torch.equal(p.detach(), q.detach())
    # Differs from decoupled decay: the mask keeps some weights.
    a, b = leaf(p), leaf(p)
    oa = muon_cpp.Muon([a], lr=0.02, weight_decay=0.5, weight_decay_mode="cautious")
    ob = muon_cpp.Muon([b], lr=0.02, weight_decay=0.5)
    a.grad, b.grad = g.clone(), g.clone()
    oa.step()
    ob.step()
    assert max_diff(a, b) > 1e-4
    r = leaf(p)
    am = muon_cpp.AdaptiveMuon([r], lr=0.02, weight_decay=0.5, weight_decay_mode="cautious")
    assert am.param_groups[0]["weight_decay_mode"] == "cautious"


def test_unknown_mode_is_named():
    p = leaf(torch.randn(4, 4))
    try:
        muon_cpp.Muon([p], weight_decay_mode="cautios")
    except ValueError as e:
        assert "cautios" in str(e) and "cautious" in str(e)
    else:
        raise AssertionError("no error")
