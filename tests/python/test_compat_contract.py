"""torch.optim's contract on the drop-in classes (muon_cpp.compat): the same
items tests/python/test_contract.py checks on muon_cpp's own classes.

Each test compares two runs of the engine, or a run with its own earlier
state: fp32 Newton–Schulz (ns_dtype=torch.float32) everywhere, and equal
inputs give bit-identical results, so the comparisons are exact.
"""
import copy

import pytest
import torch

from muon_cpp.compat.keller import SingleDeviceMuonWithAuxAdam
from muon_cpp.compat.torch import Muon

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def params(seed, shapes=((8, 6), (6, 10))):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def grads_for(ps, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g) for p in ps]


def torch_muon(ps):
    return Muon(ps, lr=0.02, ns_dtype=torch.float32)


def keller(ps):
    matrices, vectors = ps[:-1], ps[-1:]
    return SingleDeviceMuonWithAuxAdam([
        dict(params=matrices, use_muon=True, lr=0.02),
        dict(params=vectors, use_muon=False, lr=3e-3)], ns_dtype=torch.float32)


KINDS = {"torch_muon": (torch_muon, ((8, 6), (6, 10))),
         "keller": (keller, ((8, 6), (6, 10), (7,)))}


def step_with(opt, ps, step, which=None):
    for i, (p, g) in enumerate(zip(ps, grads_for(ps, step))):
        p.grad = g.clone() if which is None or i in which else None
    opt.step()


@pytest.mark.parametrize("kind", KINDS)
def test_add_param_group_steps_the_new_group_and_keeps_the_old_state(kind):
    make, shapes = KINDS[kind]
    extra_shape = (5, 9)
    # A: built with the first parameters, a group added after step 1.
    a = params(1, shapes)
    a_new = params(2, (extra_shape,))
    opt_a = make(a)
    step_with(opt_a, a, 0)
    state_before = {i: {k: v.clone() for k, v in opt_a.state[p].items() if torch.is_tensor(v)}
                    for i, p in enumerate(a)}
    group = dict(params=a_new, use_muon=True) if kind == "keller" else dict(params=a_new)
    opt_a.add_param_group(group)
    for i, p in enumerate(a):
        for k, v in state_before[i].items():
            assert torch.equal(opt_a.state[p][k], v), (kind, i, k)
    # B: built with both groups; the new parameters have no gradient at step 1.
    b = params(1, shapes)
    b_new = params(2, (extra_shape,))
    opt_b = make(b)
    opt_b.add_param_group(dict(group, params=b_new))
    step_with(opt_b, b + b_new, 0, which=set(range(len(b))))
    for s in range(1, 4):
        step_with(opt_a, a + a_new, s)
        step_with(opt_b, b + b_new, s)
    for x, y in zip(a + a_new, b + b_new):
        assert torch.equal(x, y), kind
    assert not torch.equal(a_new[0].detach(), params(2, (extra_shape,))[0].detach())


def test_add_param_group_bad_value_changes_nothing():
    ps = params(3)
    opt = torch_muon(ps)
    step_with(opt, ps, 0)
    groups = len(opt.param_groups)
    with pytest.raises(ValueError, match="momentum"):
        opt.add_param_group(dict(params=params(4, ((4, 4),)), momentum=1.5))
    assert len(opt.param_groups) == groups
    step_with(opt, ps, 1)  # still steps


@pytest.mark.parametrize("kind", KINDS)
def test_zero_grad_closure_and_deepcopy(kind):
    make, shapes = KINDS[kind]
    ps = params(5, shapes)
    opt = make(ps)
    step_with(opt, ps, 0)
    grads = [p.grad for p in ps]
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.any() for p, g in zip(ps, grads))
    opt.zero_grad()
    assert all(p.grad is None for p in ps)

    def closure():
        opt.zero_grad()
        assert torch.is_grad_enabled()
        loss = sum((p * g).sum() for p, g in zip(ps, grads_for(ps, 1)))
        loss.backward()
        return loss

    twin = params(5, shapes)
    twin_opt = make(twin)
    step_with(twin_opt, twin, 0)
    with torch.no_grad():
        loss = opt.step(closure)
    step_with(twin_opt, twin, 1)
    assert loss is not None
    for x, y in zip(ps, twin):
        assert torch.equal(x, y)

    copied = copy.deepcopy((ps, opt))
    cps, copt = copied
    assert all(c is not p and torch.equal(c, p) for c, p in zip(cps, ps))
    before = [p.detach().clone() for p in ps]
    step_with(copt, cps, 2)
    assert all(torch.equal(p, b) for p, b in zip(ps, before)), "the copy stepped the original"
    step_with(opt, ps, 2)
    for x, y in zip(ps, cps):
        assert torch.equal(x, y)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scheduler", ["ReduceLROnPlateau", "OneCycleLR", "SequentialLR",
                                       "ChainedScheduler"])
def test_schedulers_set_the_lr_the_engine_uses(kind, scheduler):
    make, shapes = KINDS[kind]
    ps = params(6, shapes)
    opt = make(ps)
    S = torch.optim.lr_scheduler

    def build(o):
        if scheduler == "ReduceLROnPlateau":
            return S.ReduceLROnPlateau(o, factor=0.5, patience=0)
        if scheduler == "OneCycleLR":
            return S.OneCycleLR(o, max_lr=0.05, total_steps=10, cycle_momentum=False)
        if scheduler == "SequentialLR":
            return S.SequentialLR(o, [S.ConstantLR(o, factor=0.5, total_iters=2),
                                      S.ExponentialLR(o, gamma=0.7)], milestones=[2])
        return S.ChainedScheduler([S.ExponentialLR(o, gamma=0.9), S.StepLR(o, 2, gamma=0.5)])

    sched = build(opt)
    ref = params(6, shapes)
    ref_opt = make(ref)
    for s in range(5):
        lrs = [g["lr"] for g in opt.param_groups]
        for g, lr in zip(ref_opt.param_groups, lrs):
            g["lr"] = lr  # the reference is told the lr by hand
        step_with(opt, ps, s)
        step_with(ref_opt, ref, s)
        for x, y in zip(ps, ref):
            assert torch.equal(x, y), (kind, scheduler, s)
        if scheduler == "ReduceLROnPlateau":
            sched.step(1.0)  # never improves: the lr halves
        else:
            sched.step()
    assert [g["lr"] for g in opt.param_groups] != lrs or scheduler == "ReduceLROnPlateau"
    if scheduler == "ReduceLROnPlateau":
        assert opt.param_groups[0]["lr"] < 0.02


@pytest.mark.skipif(not TORCH2, reason=f"step and state-dict hooks are torch 2.x, this is {torch.__version__}")
@pytest.mark.parametrize("kind", KINDS)
def test_hooks_run(kind):
    make, shapes = KINDS[kind]
    ps = params(7, shapes)
    opt = make(ps)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append("post"))
    opt.register_state_dict_pre_hook(lambda o: seen.append("sd_pre"))
    opt.register_state_dict_post_hook(lambda o, sd: seen.append("sd_post"))
    opt.register_load_state_dict_pre_hook(lambda o, sd: seen.append("load_pre"))
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load_post"))
    step_with(opt, ps, 0)
    opt.load_state_dict(opt.state_dict())
    assert seen == ["pre", "post", "sd_pre", "sd_post", "load_pre", "load_post"], seen


@pytest.mark.skipif(not TORCH2, reason=f"torch.compile is torch 2.x, this is {torch.__version__}")
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_step_equals_eager(kind):
    make, shapes = KINDS[kind]
    runs = []
    for compiled in (False, True):
        ps = params(8, shapes)
        opt = make(ps)

        def train_step(s):
            loss = sum((p * g).sum() for p, g in zip(ps, grads_for(ps, s)))
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        fn = torch.compile(train_step, backend="eager") if compiled else train_step
        for s in range(3):
            fn(s)
        runs.append([p.detach().clone() for p in ps])
    for x, y in zip(*runs):
        assert torch.equal(x, y)
