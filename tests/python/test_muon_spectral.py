"""muon_cpp.Muon's spectral options (docs/optimizer.md#spectral): the
registry's muon_spectral_* fields and weight_decay_mode spectral_clipped as
keyword options, in the param groups and the state dict; invalid values named.
tests/test_muon_spectral.cpp compares 5 steps with an fp64 SVD reference.
"""
import torch

import muon_cpp
from conftest import max_diff, value_error


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def test_spectral_options_reach_the_param_groups_and_round_trip():
    gen = torch.Generator().manual_seed(0)
    p = leaf(torch.randn(6, 10, generator=gen))
    opt = muon_cpp.Muon([p], lr=0.02, weight_decay=1.0, weight_decay_mode="spectral_clipped",
                        spectral_wd_beta=0.5, spectral_update="clip", spectral_sigma_min=0.2,
                        spectral_sigma_max=0.9)
    g = opt.param_groups[0]
    assert (g["weight_decay_mode"], g["spectral_wd_beta"]) == ("spectral_clipped", 0.5)
    assert (g["spectral_update"], g["spectral_sigma_min"], g["spectral_sigma_max"],
            g["spectral_hardcap_beta"]) == ("clip", 0.2, 0.9, 1.0)
    p.grad = torch.randn(6, 10, generator=gen)
    opt.step()
    sd = opt.state_dict()
    assert sd["param_groups"][0]["spectral_update"] == "clip"
    q = leaf(p)
    other = muon_cpp.Muon([q], lr=0.02)
    other.load_state_dict(sd)
    assert other.param_groups[0]["spectral_sigma_max"] == 0.9
    grad = torch.randn(6, 10, generator=gen)
    p.grad, q.grad = grad.clone(), grad.clone()
    opt.step()
    other.step()
    assert torch.equal(p.detach(), q.detach())


def test_hardcap_above_every_singular_value_keeps_the_update():
    # β above every singular value of u: hardcap(u) = u, so the first step is
    # p − lr·(1 − μ²)·g (EMA Nesterov: u = g + μ(buf − g), buf = (1 − μ)·g),
    # not the orthogonalized update. The hardcap's Newton–Schulz error on this
    # well-conditioned matrix is ~1e-6 of the update; 1e-3 separates them.
    gen = torch.Generator().manual_seed(1)
    p0 = torch.randn(6, 10, generator=gen)
    g = 0.1 * torch.randn(6, 10, generator=gen)
    p = leaf(p0)
    lr, mu = 0.5, 0.9
    opt = muon_cpp.Muon([p], lr=lr, momentum=mu, spectral_update="hardcap", spectral_hardcap_beta=5.0)
    p.grad = g.clone()
    opt.step()
    expected = (1 - mu * mu) * g  # shape scale √max(1, 6/10) = 1
    step = (p0 - p.detach()) / lr
    assert max_diff(step, expected) <= 1e-3 * expected.abs().max().item()


def test_invalid_spectral_values_are_named():
    p = leaf(torch.randn(6, 10))
    value_error(lambda: muon_cpp.Muon([p], spectral_update="soft"), r"spectral_update", r"soft")
    value_error(lambda: muon_cpp.Muon([p], spectral_hardcap_beta=0.0), r"spectral_hardcap_beta")
    value_error(lambda: muon_cpp.Muon([p], spectral_sigma_min=2.0), r"spectral_sigma_min", r"2")
    value_error(lambda: muon_cpp.Muon([p], lr=0.5, weight_decay=4.0, weight_decay_mode="spectral_clipped"),
                r"lr·weight_decay", r"2")
