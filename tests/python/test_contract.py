"""torch.optim's contract on the muon_cpp optimizers (docs/python.md, "torch.optim's
contract"): add_param_group, the step and state-dict hooks (torch 2.x), zero_grad,
step(closure), copy.deepcopy, torch.compile (torch 2.x) and every
torch.optim.lr_scheduler, each test parametrized over Muon, AdaptiveMuon, Lion and
MuonWithAdamW (every other class shares their base, muon_cpp.Optimizer).

Most checks compare two optimizers stepped on the same gradients bit for bit (the
same arithmetic in the same order, so equality holds on any CPU). The learning
rates and momenta a scheduler sets are checked against what the engine used:
parameters zeroed before each step move by -lr·U with U independent of lr, so they
equal lr times those of an optimizer at lr 1 (one fp32 rounding on each side: within
1e-6 relative on any CPU); momentum buffers against the fp64 EMA recurrence.
"""
import copy
import math

import pytest
import torch

import muon_cpp
from conftest import value_error

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
needs_torch2 = pytest.mark.skipif(
    not TORCH2, reason=f"torch 2.x feature; this is torch {torch.__version__}")

CLASSES = [muon_cpp.Muon, muon_cpp.AdaptiveMuon, muon_cpp.Lion, muon_cpp.MuonWithAdamW]
IDS = [c.__name__ for c in CLASSES]
# Shapes of the first parameters, the one add_param_group adds later, per class
# (the Muon kinds take matrices only; Lion and MuonWithAdamW a bias too).
SHAPES = {"w1": (8, 6), "w2": (6, 4), "b": (4,)}


def names_of(cls):
    return ["w1", "w2", "b"] if cls in (muon_cpp.Lion, muon_cpp.MuonWithAdamW) else ["w1", "w2"]


def params(cls, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(n, torch.nn.Parameter(torch.randn(SHAPES[n], generator=g))) for n in names_of(cls)]


def clone(named):
    return [(n, torch.nn.Parameter(p.detach().clone())) for n, p in named]


def build(cls, named, lr=0.02, **kw):
    if cls is muon_cpp.MuonWithAdamW:
        return cls(named, lr=lr, adamw_lr=lr, **kw)
    return cls(named, lr=lr, **kw)


def grads(named, step, only=None):
    g = torch.Generator().manual_seed(1000 + step)
    for n, p in named:
        grad = torch.randn(p.shape, generator=g)
        p.grad = grad if only is None or n in only else None


def twins(cls):
    """Two copies of cls's parameters and an optimizer over each."""
    a = params(cls)
    b = clone(a)
    return a, b, build(cls, a), build(cls, b)


def step_both(a, b, opt_a, opt_b, step):
    """Both copies get step's gradients; both optimizers step."""
    grads(a, step)
    grads(b, step)
    opt_a.step()
    opt_b.step()


def halve_float_state(opt):
    for s in opt.state.values():
        for k, v in s.items():
            if torch.is_tensor(v) and v.is_floating_point():
                v.mul_(0.5)


def assert_same(a, b):
    for (n, p), (_, q) in zip(a, b):
        assert torch.equal(p, q), n


def state_of(opt, p):
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[p].items()}


def assert_same_state(sa, sb):
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k])), k


# ---- add_param_group ------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_add_param_group_steps_the_new_group_as_if_built_with_it(cls):
    a, b = params(cls), None
    b = clone(a)
    first = [x for x in a if x[0] != "w2"]
    added = [x for x in a if x[0] == "w2"]
    opt_a = build(cls, first)
    # The reference: built with every parameter, w2 without a gradient (no state) at step 1.
    opt_b = build(cls, b)
    grads(a, 0, only={"w1", "b"})
    grads(b, 0, only={"w1", "b"})
    opt_a.step()
    opt_b.step()
    before = {n: state_of(opt_a, p) for n, p in first}
    opt_a.add_param_group({"params": [p for _, p in added]})
    new = opt_a.param_groups[-1]
    assert new["names"] == [f"group{len(opt_a.param_groups) - 1}.param0"]
    assert new["lr"] == opt_a.param_groups[0]["lr"]
    for n, p in first:  # the state goes on bit for bit
        assert_same_state(before[n], state_of(opt_a, p))
    for step in range(1, 5):
        step_both(a, b, opt_a, opt_b, step)
        assert_same(a, b)
    for (n, p), (_, q) in zip(a, b):
        assert_same_state(state_of(opt_a, p), state_of(opt_b, q))
    assert opt_a.state[added[0][1]]["step"] == 4


def test_add_param_group_lion_against_fp64_reference():
    """Lion's published step in fp64 for a group added after step 1: fp32 rounding of
    a few operations per element and step, 5 steps, stays far below 1e-5."""
    torch.manual_seed(3)
    w1 = torch.nn.Parameter(torch.randn(8, 6))
    w2 = torch.nn.Parameter(torch.randn(6, 4))
    lr, wd, b1, b2 = 0.01, 0.1, 0.9, 0.99
    opt = muon_cpp.Lion([w1], lr=lr, weight_decay=wd, beta1=b1, beta2=b2)
    ref = {id(w1): [w1.detach().double().clone(), torch.zeros(8, 6, dtype=torch.float64)]}
    gens = [torch.randn(8, 6, dtype=torch.float64) for _ in range(5)]
    gens2 = [torch.randn(6, 4, dtype=torch.float64) for _ in range(5)]
    for s in range(5):
        if s == 1:
            opt.add_param_group({"params": [w2], "lr": 2 * lr})
            ref[id(w2)] = [w2.detach().double().clone(), torch.zeros(6, 4, dtype=torch.float64)]
        w1.grad = gens[s].float()
        if s >= 1:
            w2.grad = gens2[s].float()
        opt.step()
        for p, g, rate in ((w1, gens[s], lr), (w2, gens2[s], 2 * lr)):
            if id(p) not in ref:
                continue
            x, m = ref[id(p)]
            c = b1 * m + (1 - b1) * g.float().double()
            x.mul_(1 - rate * wd).sub_(rate * torch.sign(c))
            m.mul_(b2).add_((1 - b2) * g.float().double())
    for p in (w1, w2):
        x = ref[id(p)][0]
        assert torch.allclose(p.double(), x, rtol=1e-5, atol=1e-5 * x.abs().max().item())


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_add_param_group_bad_settings_change_nothing(cls):
    a = params(cls)
    first = [x for x in a if x[0] != "w2"]
    w2 = dict(a)["w2"]
    twin = clone(first)
    opt, opt_t = build(cls, first), build(cls, twin)
    key, bad = ("beta1", 2.0) if cls is muon_cpp.Lion else ("momentum", 2.0)
    for group in ({"params": [w2], key: bad}, {"params": [w2], "bogus": 1}):
        n = len(opt.param_groups)
        with pytest.raises(ValueError) as e:
            opt.add_param_group(group)
        bad_key = "bogus" if "bogus" in group else key
        assert bad_key in str(e.value)
        if bad_key == key:
            assert "2" in str(e.value)
        assert len(e.value.args[0]) < 400
        assert len(opt.param_groups) == n
    # A parameter twice: torch's own check and message.
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [first[0][1]]})
    for step in range(3):
        step_both(first, twin, opt, opt_t, step)
    assert_same(first, twin)


def test_add_param_group_whole_run_options_and_param_names():
    w = torch.nn.Parameter(torch.randn(8, 6))
    opt = muon_cpp.AdaptiveMuon([w], beta2=0.9)
    m = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match="beta2 is a whole-run option"):
        opt.add_param_group({"params": [m], "beta2": 0.5})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [m], "param_names": ["extra.m"], "lr": 0.01})
    assert (opt.param_groups[1]["names"], opt.param_groups[1]["beta2"]) == (["extra.m"], 0.9)


def test_add_param_group_names_and_routing():
    w = torch.nn.Parameter(torch.randn(8, 6))
    opt = muon_cpp.MuonWithAdamW([("w", w)], lr=0.02, adamw_lr=1e-3, adamw_betas=(0.8, 0.9))
    bias = torch.nn.Parameter(torch.randn(6))
    opt.add_param_group({"params": [("head.bias", bias)]})  # routed by shape to AdamW
    g = opt.param_groups[-1]
    assert (g["optimizer"], g["names"], g["lr"], g["beta1"]) == ("adamw", ["head.bias"], 1e-3, 0.8)
    m = torch.nn.Parameter(torch.randn(4, 4))
    opt.add_param_group({"params": [m], "optimizer": "adamw", "lr": 5e-4})  # explicit kind
    assert opt.param_groups[-1]["optimizer"] == "adamw"
    assert opt.param_groups[-1]["names"] == [f"group{len(opt.param_groups) - 1}.param0"]
    m2 = torch.nn.Parameter(torch.randn(4, 4))
    opt.add_param_group({"params": [m2], "names": ["blocks.9.w"]})
    assert (opt.param_groups[-1]["optimizer"], opt.param_groups[-1]["lr"]) == ("muon", 0.02)
    mixed = [torch.nn.Parameter(torch.randn(3, 3)), torch.nn.Parameter(torch.randn(3))]
    n = len(opt.param_groups)
    with pytest.raises(ValueError, match="more than one optimizer"):
        opt.add_param_group({"params": mixed})
    with pytest.raises(ValueError, match="sgd"):
        opt.add_param_group({"params": mixed[:1], "optimizer": "sgd"})
    with pytest.raises(ValueError, match="blocks.9.w"):
        opt.add_param_group({"params": [("blocks.9.w", mixed[0])]})
    assert len(opt.param_groups) == n
    for p in (w, bias, m, m2):
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in (w, bias, m, m2)]
    opt.step()
    assert all(not torch.equal(p, q) for p, q in zip((w, bias, m, m2), before))
    assert set(opt.state[m]) == {"step", "exp_avg", "exp_avg_sq"}


def test_add_param_group_distributed_layout_refused():
    """A distributed layout laid its work out over the ranks at construction:
    add_param_group (and deepcopy) refuse it, naming the layout, and change nothing.
    (TensorParallel without shards builds in one process without a process group.)"""
    w = torch.nn.Parameter(torch.randn(8, 6))
    opt = muon_cpp.Muon([w], layout=muon_cpp.distributed.TensorParallel({}))
    with pytest.raises(ValueError, match="TensorParallel layout"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(4, 4))]})
    assert len(opt.param_groups) == 1
    with pytest.raises(ValueError, match="TensorParallel layout"):
        copy.deepcopy(opt)
    w.grad = torch.ones_like(w)
    opt.step()
    assert opt.state[w]["step"] == 1


# ---- hooks (torch 2.x) ----------------------------------------------------------------


@needs_torch2
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_step_hooks(cls):
    a, b, opt_a, opt_b = twins(cls)
    seen = []

    def pre(opt, args, kwargs):
        for g in opt.param_groups:  # the hook changes the gradients the step uses
            for p in g["params"]:
                p.grad.mul_(2)
        return args, {"closure": lambda: torch.tensor(7.0)}  # and the arguments

    def post(opt, args, kwargs):
        seen.append([p.detach().clone() for g in opt.param_groups for p in g["params"]])

    h1 = opt_a.register_step_pre_hook(pre)
    h2 = opt_a.register_step_post_hook(post)
    grads(a, 0)
    grads(b, 0)
    for _, p in b:
        p.grad.mul_(2)
    assert opt_a.step().item() == 7.0
    opt_b.step()
    assert_same(a, b)
    assert len(seen) == 1
    assert all(torch.equal(s, p) for s, p in zip(seen[0], [p for g in opt_a.param_groups
                                                           for p in g["params"]]))
    h1.remove()
    h2.remove()
    grads(a, 1)
    grads(b, 1)
    assert opt_a.step() is None
    opt_b.step()
    assert_same(a, b)
    assert len(seen) == 1


@needs_torch2
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_state_dict_hooks(cls):
    a, b, opt_a, opt_b = twins(cls)
    step_both(a, b, opt_a, opt_b, 0)
    calls = []
    opt_a.register_state_dict_pre_hook(lambda opt: calls.append("pre"))

    def post(opt, sd):
        sd["extra"] = 1
        return sd

    opt_a.register_state_dict_post_hook(post)
    sd = opt_a.state_dict()
    assert calls == ["pre"] and sd["extra"] == 1

    def load_pre(opt, sd):
        sd = copy.deepcopy(sd)
        for g in sd["param_groups"]:
            g["lr"] = 0.005
        return sd

    def load_post(opt):
        calls.append("load_post")
        halve_float_state(opt)  # a post hook edits the loaded state: the engine takes it

    opt_a.register_load_state_dict_pre_hook(load_pre)
    opt_a.register_load_state_dict_post_hook(load_post)
    opt_a.load_state_dict(sd)
    assert calls[-1] == "load_post"
    assert all(g["lr"] == 0.005 for g in opt_a.param_groups)
    for g in opt_b.param_groups:
        g["lr"] = 0.005
    halve_float_state(opt_b)
    step_both(a, b, opt_a, opt_b, 1)
    assert_same(a, b)


# ---- zero_grad, step(closure) ---------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_zero_grad_in_place_steps_as_a_zero_gradient(cls):
    a, b, opt_a, opt_b = twins(cls)
    step_both(a, b, opt_a, opt_b, 0)
    held = [p.grad for _, p in a]
    opt_a.zero_grad(set_to_none=False)
    assert all(p.grad is h and not h.any() for (_, p), h in zip(a, held))
    for _, p in b:
        p.grad = torch.zeros_like(p)
    decay = {}
    for g in opt_a.param_groups:
        for p in g["params"]:
            key = "exp_avg" if g["optimizer"] in ("lion", "adamw") else "momentum_buffer"
            factor = g["beta2"] if g["optimizer"] == "lion" else \
                g["beta1"] if g["optimizer"] == "adamw" else g["momentum"]
            decay[p] = (key, factor, opt_a.state[p][key].double().clone())
    opt_a.step()
    opt_b.step()
    assert_same(a, b)
    for p, (key, factor, old) in decay.items():
        # One fp32 rounding of m·β (+ 0): within 2^-23 relative.
        assert torch.allclose(opt_a.state[p][key].double(), factor * old, rtol=1e-6, atol=0)
        assert opt_a.state[p]["step"] == 2
    opt_a.zero_grad(set_to_none=True)
    assert all(p.grad is None for _, p in a)
    before = [p.detach().clone() for _, p in a]
    steps = [opt_a.state[p]["step"] for _, p in a]
    opt_a.step()  # no gradients: nothing moves, no state changes
    assert all(torch.equal(p, q) for (_, p), q in zip(a, before))
    assert [opt_a.state[p]["step"] for _, p in a] == steps


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_step_closure(cls):
    a, b, opt_a, opt_b = twins(cls)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(5))

    def loss_of(named):
        d = dict(named)
        y = torch.tanh(x @ d["w1"]) @ d["w2"]
        return (y + d["b"]).pow(2).sum() if "b" in d else y.pow(2).sum()

    for step in range(3):
        grads(a, 100 + step)  # stale gradients the closure's zero_grad clears
        enabled = []

        def closure():
            enabled.append(torch.is_grad_enabled())
            opt_a.zero_grad()
            loss = loss_of(a)
            loss.backward()
            return loss

        with torch.no_grad():
            loss = opt_a.step(closure)
        opt_b.zero_grad()
        expected = loss_of(b)
        expected.backward()
        opt_b.step()
        assert enabled == [True]
        assert torch.equal(loss.detach(), expected.detach())
        assert_same(a, b)


# ---- deepcopy -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
@pytest.mark.parametrize("with_model", [False, True])
def test_deepcopy(cls, with_model):
    a = params(cls)
    opt = build(cls, a)
    grads(a, 0)
    opt.step()
    model = torch.nn.ParameterDict(dict(a))
    if with_model:
        model_c, opt_c = copy.deepcopy((model, opt))
        assert [p for g in opt_c.param_groups for p in g["params"]] == \
            [model_c[n] for g in opt.param_groups for n in g["names"]]
    else:
        opt_c = copy.deepcopy(opt)
    copies = [(n, p) for g in opt_c.param_groups for n, p in zip(g["names"], g["params"])]
    orig = [(n, p) for g in opt.param_groups for n, p in zip(g["names"], g["params"])]
    assert all(p is not q for (_, p), (_, q) in zip(copies, orig))
    for (_, p), (_, q) in zip(orig, copies):
        assert_same_state(state_of(opt, p), state_of(opt_c, q))
        assert all(not torch.is_tensor(v) or v.data_ptr() != opt.state[p][k].data_ptr()
                   for k, v in opt_c.state[q].items())
    # The copy steps its own parameters and leaves the original untouched.
    snap = [(p.detach().clone(), state_of(opt, p)) for _, p in orig]
    grads(copies, 1)
    opt_c.step()
    for (_, p), (v, s) in zip(orig, snap):
        assert torch.equal(p, v)
        assert_same_state(s, state_of(opt, p))
    grads(orig, 1)
    opt.step()
    for step in range(2, 5):
        step_both(orig, copies, opt, opt_c, step)
        assert_same(orig, copies)


# ---- torch.compile (torch 2.x) --------------------------------------------------------


@needs_torch2
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_torch_compile_train_step(cls, backend):
    """Dynamo traces the step function with graph breaks at the optimizer's calls
    (step and zero_grad run under torch._disable_dynamo). The loss is linear in
    each weight, L = sum((x·w1·w2) ∘ t) + sum(b ∘ c), so the gradients are matrix
    products (x·w1)ᵀ·t, xᵀ·(t·w2ᵀ) and c, which every backend, inductor included,
    leaves to the same aten mm: the trajectories are equal bit for bit. The loss, a
    sum inductor may order differently, within fp32 rounding of summing its 24
    terms: 24·2^-24 (< 2e-6) of the sum of their magnitudes."""
    torch._dynamo.reset()
    a, b, opt_a, opt_b = twins(cls)
    gen = torch.Generator().manual_seed(6)
    x, t = torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)
    c = torch.randn(4, generator=gen)

    def make(named, opt):
        d = dict(named)

        def train_step(x):
            loss = (x @ d["w1"] @ d["w2"] * t).sum()
            if "b" in d:
                loss = loss + (d["b"] * c).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return train_step

    compiled = torch.compile(make(a, opt_a), backend=backend)
    eager = make(b, opt_b)
    for _ in range(4):
        with torch.no_grad():
            d = dict(b)
            size = (x @ d["w1"] @ d["w2"] * t).double().abs().sum().item()
            size += (d["b"] * c).double().abs().sum().item() if "b" in d else 0.0
        la = compiled(x)
        lb = eager(x)
        assert abs(la.item() - lb.item()) <= 2e-6 * size
        if backend != "inductor":
            assert torch.equal(la.detach(), lb.detach())
        assert_same(a, b)
        assert all(p.grad is None for _, p in a)
    assert opt_a.state[dict(a)["w1"]]["step"] == 4


# ---- lr schedulers ----------------------------------------------------------------------

S = torch.optim.lr_scheduler
LR0 = 0.04


def _schedulers():
    out = {
        "StepLR": (lambda o: S.StepLR(o, step_size=2, gamma=0.5), lambda e: LR0 * 0.5 ** (e // 2)),
        "MultiStepLR": (lambda o: S.MultiStepLR(o, milestones=[2, 4], gamma=0.3),
                        lambda e: LR0 * 0.3 ** ((e >= 2) + (e >= 4))),
        "ExponentialLR": (lambda o: S.ExponentialLR(o, gamma=0.7), lambda e: LR0 * 0.7 ** e),
        "CosineAnnealingLR": (lambda o: S.CosineAnnealingLR(o, T_max=5, eta_min=0.001),
                              lambda e: 0.001 + (LR0 - 0.001) * (1 + math.cos(math.pi * e / 5)) / 2),
        "CosineAnnealingWarmRestarts": (
            lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, eta_min=0.002),
            lambda e: 0.002 + (LR0 - 0.002) * (1 + math.cos(math.pi * (e % 3) / 3)) / 2),
        "LambdaLR": (lambda o: S.LambdaLR(o, lambda e: 1 / (e + 1)), lambda e: LR0 / (e + 1)),
        "MultiplicativeLR": (lambda o: S.MultiplicativeLR(o, lambda e: 0.8), lambda e: LR0 * 0.8 ** e),
        "LinearLR": (lambda o: S.LinearLR(o, start_factor=0.25, total_iters=4),
                     lambda e: LR0 * (0.25 + 0.75 * min(e, 4) / 4)),
        "ConstantLR": (lambda o: S.ConstantLR(o, factor=0.5, total_iters=3),
                       lambda e: LR0 * (0.5 if e < 3 else 1.0)),
        "CyclicLR": (lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=LR0, step_size_up=2,
                                          cycle_momentum="momentum" in o.defaults), None),
        "OneCycleLR": (lambda o: S.OneCycleLR(o, max_lr=LR0, total_steps=8,
                                              cycle_momentum="momentum" in o.defaults), None),
        "ReduceLROnPlateau": (lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=0), None),
        "SequentialLR": (lambda o: S.SequentialLR(o, [S.ConstantLR(o, factor=0.5, total_iters=2),
                                                      S.ExponentialLR(o, gamma=0.8)], milestones=[2]),
                         None),
        "ChainedScheduler": (lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=2),
                                                           S.ExponentialLR(o, gamma=0.8)]),
                             lambda e: LR0 * (0.5 if e < 2 else 1.0) * 0.8 ** e),
    }
    if hasattr(S, "PolynomialLR"):
        out["PolynomialLR"] = (lambda o: S.PolynomialLR(o, total_iters=5, power=2.0),
                               lambda e: LR0 * (1 - min(e, 5) / 5) ** 2)
    return out


SCHEDULERS = _schedulers()
STEPS = 7


def _zero(named):
    with torch.no_grad():
        for _, p in named:
            p.zero_()


def _momentum_keys(group):
    return ["momentum"] if "momentum" in group else []


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_lr_scheduler_values_reach_the_engine(cls, name):
    make, formula = SCHEDULERS[name]
    a = params(cls)
    c = clone(a)
    opt, unit = build(cls, a, lr=LR0), build(cls, c, lr=1.0)
    sched = make(opt)
    cycled = name in ("CyclicLR", "OneCycleLR") and "momentum" in opt.defaults
    buffers = {}  # fp64 EMA of each momentum-buffer parameter's gradients
    lrs, moms = [], []
    for step in range(STEPS):
        used = [g["lr"] for g in opt.param_groups]
        lrs.append(used[0])
        if formula is not None:
            assert used[0] == pytest.approx(formula(step), rel=1e-12, abs=1e-15)
        for g, h in zip(opt.param_groups, unit.param_groups):
            for k in _momentum_keys(g):
                h[k] = g[k]  # the reference takes the momentum the scheduler set
        moms.append([g.get("momentum") for g in opt.param_groups])
        _zero(a)
        _zero(c)
        step_both(a, c, opt, unit, step)
        for g, h in zip(opt.param_groups, unit.param_groups):
            for p, q in zip(g["params"], h["params"]):
                # p = -lr·U, q = -1·U: one fp32 rounding each (within 1e-6 relative).
                assert torch.allclose(p, g["lr"] * q, rtol=1e-6, atol=1e-30)
                assert q.abs().max() > 0
                if "momentum_buffer" in opt.state[p] and g.get("momentum_style", "ema") == "ema":
                    m = g["momentum"]
                    buf = buffers.get(p, torch.zeros(p.shape, dtype=torch.float64))
                    buffers[p] = buf = m * buf + (1 - m) * p.grad.double()
                    got = opt.state[p]["momentum_buffer"].double()
                    # fp32 rounding of a few operations per step over 7 steps.
                    assert torch.allclose(got, buf, rtol=1e-5, atol=1e-6 * buf.abs().max().item())
        if name == "ReduceLROnPlateau":
            sched.step(float(step))  # worse every step: the lr halves
        else:
            sched.step()
        if hasattr(sched, "get_last_lr"):
            assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
    assert len(set(lrs)) > 1, lrs
    if cycled:
        assert len({m[0] for m in moms}) > 1, moms


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_cycle_momentum_follows_torch_rule(cls):
    """CyclicLR and OneCycleLR cycle 'momentum' (or torch's 'betas') when the
    optimizer's defaults have it: the Muon kinds do; Lion (beta1, beta2) and
    MuonWithAdamW (mixed kinds) refuse cycle_momentum=True as torch does."""
    opt = build(cls, params(cls), lr=LR0)
    if cls in (muon_cpp.Muon, muon_cpp.AdaptiveMuon):
        S.OneCycleLR(opt, max_lr=LR0, total_steps=4)
        assert opt.param_groups[0]["momentum"] == pytest.approx(0.95)
    else:
        with pytest.raises(ValueError):
            S.CyclicLR(opt, base_lr=0.01, max_lr=LR0, cycle_momentum=True)
        with pytest.raises(ValueError):
            S.OneCycleLR(opt, max_lr=LR0, total_steps=4)


@pytest.mark.parametrize("name", ["OneCycleLR", "CosineAnnealingWarmRestarts", "StepLR"])
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_scheduler_and_optimizer_resume_together(cls, name):
    make = SCHEDULERS[name][0]
    a = params(cls)
    opt = build(cls, a, lr=LR0)
    sched = make(opt)
    for step in range(3):
        grads(a, step)
        opt.step()
        sched.step()
    saved = copy.deepcopy((opt.state_dict(), sched.state_dict()))
    b = clone(a)
    opt_b = build(cls, b, lr=0.5)
    sched_b = make(opt_b)
    opt_b.load_state_dict(saved[0])
    sched_b.load_state_dict(saved[1])
    for step in range(3, 7):
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in opt_b.param_groups]
        step_both(a, b, opt, opt_b, step)
        sched.step()
        sched_b.step()
        assert_same(a, b)


# ---- every other class: add_param_group and deepcopy through the shared base ----------

OTHERS = [muon_cpp.LaProp, muon_cpp.Signum, muon_cpp.SimAdEMAMix, muon_cpp.SOAP, muon_cpp.Dion2,
          muon_cpp.NorDion2, muon_cpp.Dion, muon_cpp.Iso, muon_cpp.MOSO, muon_cpp.KlSoap,
          muon_cpp.KlMSoap, muon_cpp.REKLS, muon_cpp.ReklsV3, muon_cpp.StackedSoap,
          muon_cpp.ObliqueSGD, muon_cpp.ObliqueAdam,
          muon_cpp.PolarGrad, muon_cpp.Scion, muon_cpp.MOP, muon_cpp.SPEL, muon_cpp.MuonHyperball]


@pytest.mark.parametrize("cls", OTHERS, ids=[c.__name__ for c in OTHERS])
def test_other_classes_add_param_group_and_deepcopy(cls):
    g = torch.Generator().manual_seed(9)
    a = [(n, torch.nn.Parameter(torch.randn(SHAPES[n], generator=g))) for n in ("w1", "w2")]
    b = clone(a)
    opt_a = cls([a[0]])
    opt_b = cls(b)
    grads(a, 0, only={"w1"})
    grads(b, 0, only={"w1"})
    opt_a.step()
    opt_b.step()
    opt_a.add_param_group({"params": [a[1][1]]})
    for step in range(1, 4):
        step_both(a, b, opt_a, opt_b, step)
        assert_same(a, b)
    opt_c = copy.deepcopy(opt_a)
    c = [(n, p) for grp in opt_c.param_groups for n, p in zip(grp["names"], grp["params"])]
    for step in range(4, 6):
        step_both(a, c, opt_a, opt_c, step)
        assert_same(a, c)
    for (_, p), (_, q) in zip(a, c):
        assert_same_state(state_of(opt_a, p), state_of(opt_c, q))


def test_make_optimizer_add_param_group_follows_the_config():
    """make_optimizer's groups come from the config: an added group is planned by
    it too (its override rules match the new parameters' names)."""
    w, q0 = torch.nn.Parameter(torch.randn(8, 6)), torch.nn.Parameter(torch.randn(6, 6))
    opt = muon_cpp.make_optimizer([("blocks.0.w", w), ("blocks.0.attn.qkv.weight", q0)], {
        "optimizer": "muon", "lr": 0.03,
        "overrides": [{"match": {"name": "*.qkv.weight"}, "set": {"lr": 0.01}}]})
    qkv, other = torch.nn.Parameter(torch.randn(6, 6)), torch.nn.Parameter(torch.randn(6, 6))
    opt.add_param_group({"params": [("blocks.1.attn.qkv.weight", qkv)]})
    opt.add_param_group({"params": [other]})
    assert sorted(g["lr"] for g in opt.param_groups) == [0.01, 0.01, 0.03, 0.03]
    assert (opt.param_groups[2]["lr"], opt.param_groups[3]["lr"]) == (0.01, 0.03)
    assert opt.param_groups[3]["names"] == ["group3.param0"]
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.randn(3, 3))], "lr": -1.0})
    assert len(opt.param_groups) == 4
    for p in (w, q0, qkv, other):
        p.grad = torch.ones_like(p)
    opt.step()
    assert all(opt.state[p]["step"] == 1 for p in (w, q0, qkv, other))
