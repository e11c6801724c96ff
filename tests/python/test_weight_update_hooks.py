"""The weight-update hooks (docs/optimizer.md#weight-update-hooks) from Python:
AdamW and SGD wearing each hook against torch.optim's own AdamW and SGD
stepped on a copy, taken apart (U = (c·p − p_torch)/lr) and hooked by the
formulas of Emerging-Optimizers' emerging_optimizers/weight_update_hooks/
{hyperball,radial_brake,relative_update}.py at fd77292, in fp64; the keys in
the param groups, fixed after construction; the refusals."""
import pytest
import torch

import muon_cpp

HOOKS = ("hyperball", "radial_brake", "relative_update")
EPS = 1e-15


def ref_hooked(p_wd, u, lr, hook, radius=2.0, outward=0.5, inward=0.25):
    """pre_weight_update_inplace, p.add_(u, alpha=-lr), post_weight_update_inplace."""
    if hook == "hyperball":
        n = u.norm()
        u = u * 0 if n < EPS else u * (radius / max(n, EPS))
        p = p_wd - lr * u
        n = p.norm()
        return p * 0 if n < EPS else p * (radius / max(n, EPS))
    if hook == "relative_update":
        wn, un = p_wd.norm(), u.norm()
        return p_wd - lr * (0.0 if wn < EPS or un < EPS else wn / max(un, EPS)) * u
    pre = p_wd.norm().item()
    pre = 0.0 if pre < EPS else pre
    p = p_wd - lr * u
    post = p.norm().item()
    post = 0.0 if post < EPS else post
    delta = post - pre
    scale = outward if delta >= EPS else (inward if delta <= -EPS else 0.0)
    return p * (0.0 if post < EPS else (pre + scale * delta) / max(post, EPS))


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_hooked_step_is_torchs_step_hooked(hook, kind):
    gen = torch.Generator().manual_seed(5)
    lr, wd = 0.02, 0.1
    w = torch.nn.Parameter(torch.randn(12, 8, generator=gen, dtype=torch.float64))
    ref = torch.nn.Parameter(w.detach().clone())
    config = {"optimizer": kind, "lr": lr, "weight_decay": wd, "weight_update_hook": hook,
              "weight_update_hook_radius": 2.0, "weight_update_hook_inward_scale": 0.25}
    if kind == "adamw":
        config["adam_beta2"] = 0.999
        torch_opt = torch.optim.AdamW([ref], lr=lr, weight_decay=wd)
        decay = 1 - lr * wd  # decoupled
    else:
        config["sgd_momentum"] = 0.9
        torch_opt = torch.optim.SGD([ref], lr=lr, weight_decay=wd, momentum=0.9)
        decay = 1.0  # L2: wd·p is in the update
    opt = muon_cpp.make_optimizer([("w", w)], config)
    for _ in range(4):
        g = torch.randn(12, 8, generator=gen, dtype=torch.float64)
        w.grad, ref.grad = g.clone(), g.clone()
        p_wd = w.detach() * decay
        ref.data.copy_(w.detach())  # torch's step from the same weight (its state follows the same grads)
        torch_opt.step()
        want = ref_hooked(p_wd, (p_wd - ref.detach()) / lr, lr, hook)
        opt.step()
        # fp64 on both sides; the hook's scale (R/‖U‖, ‖p‖/‖U‖) is O(1) here.
        assert (w.detach() - want).abs().max().item() <= 1e-12 * want.abs().max().item()
        if hook == "hyperball":
            assert abs(w.norm().item() - 2.0) <= 1e-12


def test_a_weight_decay_edited_in_the_param_group_is_the_one_the_hook_reads():
    """A schedule of weight_decay reaches the hook: taken apart with the old
    coefficient, the decayed weight would be off by lr·0.2·|p| = 4e-3·|p|."""
    gen = torch.Generator().manual_seed(7)
    lr = 0.02
    w = torch.nn.Parameter(torch.randn(12, 8, generator=gen, dtype=torch.float64))
    ref = torch.nn.Parameter(w.detach().clone())
    opt = muon_cpp.make_optimizer([("w", w)], {"optimizer": "adamw", "lr": lr, "weight_decay": 0.1,
                                               "adam_beta2": 0.999, "weight_update_hook": "relative_update"})
    torch_opt = torch.optim.AdamW([ref], lr=lr, weight_decay=0.1)
    for step in range(3):
        if step == 1:
            opt.param_groups[0]["weight_decay"] = 0.3
            torch_opt.param_groups[0]["weight_decay"] = 0.3
        wd = opt.param_groups[0]["weight_decay"]
        g = torch.randn(12, 8, generator=gen, dtype=torch.float64)
        w.grad, ref.grad = g.clone(), g.clone()
        p_wd = w.detach() * (1 - lr * wd)
        ref.data.copy_(w.detach())
        torch_opt.step()
        want = ref_hooked(p_wd, (p_wd - ref.detach()) / lr, lr, "relative_update")
        opt.step()
        assert (w.detach() - want).abs().max().item() <= 1e-12 * want.abs().max().item()


def test_a_hooked_groups_decay_method_is_fixed_after_construction():
    w = torch.nn.Parameter(torch.randn(16, 8))
    opt = muon_cpp.Muon([w], lr=0.02, weight_update_hook="hyperball")
    key = next(k for k in opt.param_groups[0] if k.endswith("weight_decay_mode"))
    opt.param_groups[0][key] = "independent"
    w.grad = torch.randn_like(w)
    kept = w.detach().clone()
    with pytest.raises(ValueError, match=r"weight_decay_mode'\] is fixed at construction"):
        opt.step()
    assert torch.equal(w.detach(), kept)
    # Without a hook it stays editable.
    plain = muon_cpp.Muon([torch.nn.Parameter(torch.randn(16, 8))], lr=0.02)
    plain.param_groups[0][key] = "independent"
    plain.param_groups[0]["params"][0].grad = torch.randn(16, 8)
    plain.step()


def test_the_keys_are_in_the_groups_and_fixed_after_construction():
    w = torch.nn.Parameter(torch.randn(16, 8))
    opt = muon_cpp.Muon([w], lr=0.02, weight_update_hook="relative_update")
    assert opt.param_groups[0]["weight_update_hook"] == "relative_update"
    assert opt.param_groups[0]["weight_update_hook_radius"] == 1.0
    before = w.detach().clone()
    w.grad = torch.randn_like(w)
    opt.step()
    # relative_update: the lr is the size of the step relative to the weight.
    assert abs((w.detach() - before).norm().item() / before.norm().item() - 0.02) < 1e-5
    opt.param_groups[0]["weight_update_hook"] = "hyperball"
    kept = w.detach().clone()
    with pytest.raises(ValueError, match=r"weight_update_hook'\] is fixed at construction"):
        opt.step()
    assert torch.equal(w.detach(), kept)
    state = opt.state_dict()
    assert state["param_groups"][0]["weight_update_hook"] == "hyperball"


@pytest.mark.parametrize("kind,reason", [("iso", "rebuilds the weight"), ("spel", "re-orthogonalizes"),
                                         ("oblique_sgd", "renormalizes"),
                                         ("muon_hyperball", "hyperball hook already")])
def test_optimizers_whose_step_is_not_an_update_added_refuse_them(kind, reason):
    w = torch.nn.Parameter(torch.randn(12, 8))
    with pytest.raises(ValueError, match=f"cannot wear optimizer '{kind}': it .*{reason}"):
        muon_cpp.make_optimizer([("w", w)], {"optimizer": kind, "weight_update_hook": "radial_brake"})


def test_bad_values_name_the_field():
    w = torch.nn.Parameter(torch.randn(12, 8))
    with pytest.raises(ValueError, match="weight_update_hook_outward_scale"):
        muon_cpp.Muon([w], weight_update_hook="radial_brake", weight_update_hook_outward_scale=2.0)
    with pytest.raises(ValueError, match="weight_update_hook must be one of"):
        muon_cpp.Muon([w], weight_update_hook="sphere")
