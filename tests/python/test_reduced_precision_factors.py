"""bf16 parameters: the decay and momentum factors are applied in fp32 and the
result rounded once, as torch's own optimizers do (torch >= 2.x).

Multiplying a bf16 tensor in place by a number in ATen's C++ API rounds the
number to bf16 first: 1 − lr·wd = 0.99 would become 0.98828125, a weight
decay 17% stronger than asked. With a zero gradient every optimizer here
leaves the update at zero, so one step is exactly the decay:
p ← bf16(float(p)·(1 − lr·wd)), compared bit for bit. Each case also checks
that the factor rounded to bf16 gives another result on these values, so
the comparison tells the two apart.
"""
import pytest
import torch

import muon_cpp

LR, WD = 0.1, 0.1  # 1 − lr·wd = 0.99, not a bf16 number


def decayed(p0, factor):
    return (p0.float() * factor).to(torch.bfloat16)


CASES = {
    "muon": lambda ps: muon_cpp.Muon(ps, lr=LR, weight_decay=WD),
    "lion": lambda ps: muon_cpp.Lion(ps, lr=LR, weight_decay=WD),
    "laprop": lambda ps: muon_cpp.LaProp(ps, lr=LR, weight_decay=WD),
    "dion2": lambda ps: muon_cpp.Dion2(ps, lr=LR, weight_decay=WD),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bf16_weight_decay_is_the_fp32_factor_rounded_once(name):
    g = torch.Generator().manual_seed(3)
    p0 = (torch.randn(16, 8, generator=g) * 2).to(torch.bfloat16)
    p = torch.nn.Parameter(p0.clone())
    p.grad = torch.zeros_like(p)
    CASES[name]([p]).step()
    expected = decayed(p0, 1 - LR * WD)
    assert torch.equal(p.detach(), expected), (p.detach() - expected).abs().max()
    rounded_factor = torch.tensor(1 - LR * WD).to(torch.bfloat16).item()
    assert not torch.equal(expected, decayed(p0, rounded_factor))


def test_bf16_classic_momentum_is_the_fp32_factor_rounded_once():
    # momentum_style="classic": buf ← bf16(bf16(float(buf)·μ) + g); after one
    # step buf = g (from zero), after the second bf16(bf16(g1·μ) + g2).
    g = torch.Generator().manual_seed(4)
    shape = (8, 8)
    p = torch.nn.Parameter(torch.randn(*shape, generator=g).to(torch.bfloat16))
    g1, g2 = (torch.randn(*shape, generator=g).to(torch.bfloat16) for _ in range(2))
    opt = muon_cpp.Muon([p], lr=0.01, momentum=0.95, momentum_style="classic", nesterov=False)
    for grad in (g1, g2):
        p.grad = grad.clone()
        opt.step()
    expected = (decayed(g1, 0.95).float() + g2.float()).to(torch.bfloat16)
    assert torch.equal(opt.state[p]["momentum_buffer"], expected)
    rounded = torch.tensor(0.95).to(torch.bfloat16).item()
    assert not torch.equal(expected, (decayed(g1, rounded).float() + g2.float()).to(torch.bfloat16))
