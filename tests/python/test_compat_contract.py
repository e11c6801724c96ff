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


# ---- another class's state_dict ---------------------------------------------------

def muon_cpp_muon(ps):
    import muon_cpp
    return muon_cpp.Muon(ps, lr=0.02, ns_compute_dtype="float32")


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9)


# (builder, shapes, the class name load_state_dict names, a key its groups have
# and another class's lack, what its state_dict looks like)
CLASSES = {
    "keller": (keller, KINDS["keller"][1], "muon_cpp.compat.keller.SingleDeviceMuonWithAuxAdam",
               "use_muon", "Keller Jordan's MuonWithAuxAdam"),
    "torch_muon": (torch_muon, KINDS["torch_muon"][1], "muon_cpp.compat.torch.Muon",
                   "ns_coefficients", "torch.optim.Muon's"),
    "muon_cpp": (muon_cpp_muon, KINDS["torch_muon"][1], "muon_cpp.Muon", "momentum_style",
                 "a muon_cpp optimizer's, a group of 'muon'"),
    "sgd": (sgd, KINDS["torch_muon"][1], "torch.optim.SGD", "dampening", "torch.optim.SGD's"),
}


def snapshot(opt):
    sd = opt.state_dict()
    groups = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    state = {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
             for k, s in sd["state"].items()}
    return groups, state


def same(a, b):
    (ga, sa), (gb, sb) = a, b
    assert ga == gb and sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].keys() == sb[k].keys()
        for n in sa[k]:
            x, y = sa[k][n], sb[k][n]
            assert torch.equal(x, y) if torch.is_tensor(x) else x == y, (k, n)


@pytest.mark.parametrize("into,source", [(i, s) for i in ("keller", "torch_muon", "muon_cpp")
                                         for s in ("keller", "torch_muon", "muon_cpp", "sgd")
                                         if i != s])
def test_another_class_state_dict_is_refused_naming_what_differs(into, source):
    make, shapes, name, key, _ = CLASSES[into]
    ps = params(9, shapes)
    opt = make(ps)
    step_with(opt, ps, 0)
    before = snapshot(opt)
    src_make, src_shapes, _, _, looks = CLASSES[source]
    src_ps = params(10, src_shapes)
    src = src_make(src_ps)
    step_with(src, src_ps, 0)
    with pytest.raises(ValueError) as info:
        opt.load_state_dict(src.state_dict())
    msg = str(info.value)
    assert msg.startswith("load_state_dict: param_groups[0] lacks "), msg
    assert f"'{key}'" in msg or key == "momentum_style", msg
    assert f"not from {name} " in msg and looks in msg, msg
    assert len(msg) < 400 and "\n" not in msg, msg
    same(snapshot(opt), before)
    step_with(opt, ps, 1)  # still steps


def test_keller_state_dict_with_another_use_muon_is_refused():
    ps = params(11, KINDS["keller"][1])
    opt = keller(ps)
    sd = opt.state_dict()
    sd["param_groups"] = sd["param_groups"][::-1]
    before = snapshot(opt)
    with pytest.raises(ValueError, match=r"param_groups\[0\] has use_muon=False, this "
                                         r"optimizer's has use_muon=True"):
        opt.load_state_dict(sd)
    same(snapshot(opt), before)


def test_torch_optim_muon_state_dict_without_ours_loads():
    # torch.optim.Muon's groups have no ns_dtype (ours); use_addmm is not in every
    # torch's: such a group keeps this optimizer's values for them.
    a = params(12)
    opt_a = torch_muon(a)
    step_with(opt_a, a, 0)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = torch_muon(b)
    sd = opt_a.state_dict()
    for g in sd["param_groups"]:
        del g["ns_dtype"], g["use_addmm"]
    opt_b.load_state_dict(sd)
    assert opt_b.param_groups[0]["ns_dtype"] is torch.float32
    for s in range(1, 3):
        step_with(opt_a, a, s)
        step_with(opt_b, b, s)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("state_dict,pattern", [
    ([1, 2], r"expected a torch.optim state_dict .*got list"),
    ({"state": {}}, r"'param_groups' should be a list of dicts, got NoneType"),
    ({"state": [], "param_groups": []}, r"'state' should be a dict, got list"),
    ({"state": {}, "param_groups": [3]}, r"param_groups\[0\] should be a dict, got int"),
])
@pytest.mark.parametrize("into", ["keller", "torch_muon", "muon_cpp"])
def test_a_state_dict_not_in_torchs_format_is_refused(into, state_dict, pattern):
    make, shapes = CLASSES[into][:2]
    opt = make(params(13, shapes))
    with pytest.raises(ValueError, match=pattern):
        opt.load_state_dict(state_dict)


def test_keller_add_param_group_names_the_new_groups_index():
    ps = params(14, KINDS["keller"][1])
    opt = keller(ps)
    step_with(opt, ps, 0)
    before = snapshot(opt)
    extra = params(15, ((4, 4),))
    with pytest.raises(ValueError, match=r"^param_groups\[2\] has no 'use_muon' key"):
        opt.add_param_group(dict(params=extra))
    with pytest.raises(ValueError, match=r"^param_groups\[2\]\['lr'\] .*-1"):
        opt.add_param_group(dict(params=extra, use_muon=True, lr=-1.0))
    assert len(opt.param_groups) == 2
    same(snapshot(opt), before)
