"""muon_cpp.Muon(num_heads=H): per-head Newton–Schulz (docs/optimizer.md#per-head),
the rows in H equal blocks of consecutive rows, each orthogonalized and scaled
from its own shape, against an fp64 reference per head block over 5 steps;
the keyword in the param groups and the state dict; a bad value named."""
import math

import torch

import muon_cpp
from conftest import leaf, ref_newton_schulz, schedule_of, within_fp32_steps


def ref_orth_heads(u, heads):
    hr, cols = u.shape[0] // heads, u.shape[1]
    blocks = [ref_newton_schulz(u[h * hr:(h + 1) * hr], schedule_of("quintic"))
              * math.sqrt(max(1.0, hr / cols)) for h in range(heads)]
    return torch.cat(blocks)


def test_matches_per_head_reference_over_five_steps():
    gen = torch.Generator().manual_seed(5)
    shapes = [((36, 12), 4), ((12, 8), 3)]
    params = [leaf(torch.randn(*s, generator=gen)) for s, _ in shapes]
    refs = [p.detach().to(torch.float64).clone() for p in params]
    bufs = [torch.zeros_like(r) for r in refs]
    lr, mu = 0.02, 0.95
    opts = [muon_cpp.Muon([p], lr=lr, num_heads=h) for p, (_, h) in zip(params, shapes)]
    for _ in range(5):
        for p, r, b, (_, h) in zip(params, refs, bufs, shapes):
            g = torch.randn(*p.shape, generator=gen)
            p.grad = g.clone()
            gd = g.to(torch.float64)
            b.mul_(mu).add_((1 - mu) * gd)
            r.sub_(lr * ref_orth_heads((1 - mu) * gd + mu * b, h))
        for o in opts:
            o.step()
    # fp32 per-head Newton–Schulz against fp64: ~1e-6 of the parameters
    # after five steps on any CPU (tests/test_muon_heads.cpp says why).
    for p, r in zip(params, refs):
        assert within_fp32_steps(p, r)


def test_keyword_round_trips_and_bad_values_are_named():
    p = leaf(torch.randn(12, 8))
    opt = muon_cpp.Muon([p], lr=0.02, num_heads=3)
    assert opt.param_groups[0]["num_heads"] == 3
    p.grad = torch.randn(12, 8)
    opt.step()
    q = leaf(p)
    other = muon_cpp.Muon([q], lr=0.02)
    other.load_state_dict(opt.state_dict())
    assert other.param_groups[0]["num_heads"] == 3
    try:
        muon_cpp.Muon([leaf(torch.randn(12, 8))], num_heads=5)
    except ValueError as e:
        assert "num_heads 5" in str(e) and "[12, 8]" in str(e)
    else:
        raise AssertionError("no error")
