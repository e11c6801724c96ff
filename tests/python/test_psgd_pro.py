"""muon_cpp.PSGDPro (Emerging-Optimizers' psgd_pro; the arithmetic against an
fp64 reference is tests/test_psgd_pro.cpp): its keywords and defaults in the
param groups, its state in torch.optim's format, its draws seeded (the same run
twice is the same run; another seed, another run), a state_dict round trip,
and a bad value named."""
import pytest
import torch

import muon_cpp


def run(seed=0, steps=4, **kw):
    gen = torch.Generator().manual_seed(1)
    w = torch.nn.Parameter(torch.randn(12, 8, generator=gen))
    opt = muon_cpp.PSGDPro([w], lr=0.01, seed=seed, **kw)
    for _ in range(steps):
        w.grad = torch.randn(12, 8, generator=gen)
        opt.step()
    return w.detach().clone(), opt, w


def test_keywords_defaults_and_state():
    _, opt, w = run()
    g = opt.param_groups[0]
    assert g["optimizer"] == "psgd_pro"
    assert (g["momentum"], g["beta_lip"], g["precond_lr"], g["min_precond_lr"]) == (0.9, 0.9, 0.1, 0.01)
    assert (g["warmup_steps"], g["weight_decay"], g["weight_decay_method"]) == (10000, 0.01, "decoupled")
    st = opt.state[w]
    assert st["step"] == 4
    assert st["exp_avg"].shape == (12, 8) and st["Q_L"].shape == (12, 12) and st["Q_R"].shape == (8, 8)
    assert st["lip_L"].shape == () and st["lip_L"].item() >= 1.0


def test_draws_are_seeded_and_a_state_dict_resumes_bit_for_bit():
    a, _, _ = run(seed=3)
    b, _, _ = run(seed=3)
    c, _, _ = run(seed=4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    _, opt, w = run(seed=3, steps=2)
    saved = opt.state_dict()
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = muon_cpp.PSGDPro([w2], lr=0.01, seed=3)
    opt2.load_state_dict(saved)
    gen = torch.Generator().manual_seed(9)
    grads = [torch.randn(12, 8, generator=gen) for _ in range(2)]
    for o, p in ((opt, w), (opt2, w2)):
        for g in grads:
            p.grad = g.clone()
            o.step()
    assert torch.equal(w.detach(), w2.detach())


def test_bad_values_name_the_keyword():
    w = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match="warmup_steps"):
        muon_cpp.PSGDPro([w], warmup_steps=0)
    with pytest.raises(ValueError, match="weight_decay_method"):
        muon_cpp.PSGDPro([w], weight_decay_method="palm")
