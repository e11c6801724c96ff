"""state_dict() / load_state_dict() of the muon_cpp optimizers: torch.optim's
format, a torch.save/torch.load round trip that continues bit for bit, errors
for mismatched groups, and an LR scheduler's state saved alongside."""
import copy
import io

import pytest
import torch
from torch import nn

import muon_cpp

STEPS = 6
SAVE_AT = 3


class TinyLm(nn.Module):
    """Embedding, LayerNorm, two hidden matrices with biases, an output head."""

    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.lm_head = nn.Linear(d, vocab, bias=False)


class Matrices(nn.Module):
    """Parameters every optimizer here takes: matrices and a conv weight."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(12, 8))
        self.b = nn.Parameter(torch.randn(6, 10))
        self.conv = nn.Parameter(torch.randn(4, 3, 2, 2))


def build(kind, model, **over):
    """The optimizer `kind` over `model`, with two param groups where the kind
    takes plain params (different options in each)."""
    if kind == "hybrid":
        opts = dict(lr=0.03, weight_decay=0.1, adamw_lr=3e-3, adamw_weight_decay=0.01)
        opts.update(over)
        return muon_cpp.MuonWithAdamW(model.named_parameters(), **opts)
    params = list(model.parameters())
    groups = [dict(params=params[:2]), dict(params=params[2:])]
    if kind == "muon":
        groups[1].update(momentum=0.8, scale_mode="spectral", lr=0.01)
        return muon_cpp.Muon(groups, **dict(dict(lr=0.02, weight_decay=0.05), **over))
    if kind == "adamuon":
        groups[1].update(momentum=0.8, lr=0.01)
        return muon_cpp.AdaptiveMuon(groups, **dict(dict(lr=0.02, mode="adamuon", beta2=0.8), **over))
    if kind == "normuon":
        groups[1].update(nesterov=False, lr=0.01)
        return muon_cpp.AdaptiveMuon(groups, **dict(dict(lr=0.02, mode="normuon"), **over))
    if kind == "lion":
        groups[1].update(beta1=0.8, lr=0.02)
        return muon_cpp.Lion(groups, **dict(dict(lr=0.01, weight_decay=0.1), **over))
    if kind == "laprop":
        groups[1].update(beta1=0.8, correct_bias=False, lr=0.02)
        return muon_cpp.LaProp(groups, **dict(dict(lr=0.01, weight_decay=0.1), **over))
    if kind == "signum":
        groups[1].update(momentum=0.8, nesterov=True, weight_decay_method="l2", lr=0.02)
        return muon_cpp.Signum(groups, **dict(dict(lr=0.01, weight_decay=0.1), **over))
    if kind == "sim_ademamix":
        groups[1].update(beta1=0.95, num_beta_fast_warmup_steps=3, alpha=1.0, lr=0.02)
        return muon_cpp.SimAdEMAMix(groups, **dict(dict(lr=0.01, weight_decay=0.1), **over))
    if kind == "soap":
        groups[1].update(beta1=0.8, precondition_frequency=2, lr=0.02)
        return muon_cpp.SOAP(groups, **dict(dict(lr=0.01, weight_decay=0.1), **over))
    raise AssertionError(kind)


def make_model(kind, seed):
    torch.manual_seed(seed)
    return TinyLm() if kind == "hybrid" else Matrices()


def make_grads(model, seed=99):
    gen = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(*p.shape, generator=gen) for n, p in model.named_parameters()}
            for _ in range(STEPS)]


def run(model, opt, grads, sched=None):
    for g in grads:
        for n, p in model.named_parameters():
            p.grad = g[n].clone()
        opt.step()
        if sched is not None:
            sched.step()


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


STATE_KEYS = {
    "muon": {"step", "momentum_buffer"},
    "adamuon": {"step", "momentum_buffer", "second_moment"},
    "normuon": {"step", "momentum_buffer", "second_moment"},
    "lion": {"step", "exp_avg"},
    "laprop": {"step", "exp_avg", "exp_avg_sq"},
    "signum": {"step", "exp_avg"},
    "sim_ademamix": {"step", "exp_avg", "exp_avg_sq"},
    "soap": {"step", "exp_avg", "exp_avg_sq", "L", "R", "Q_L", "Q_R"},
}

KINDS = ["muon", "adamuon", "normuon", "lion", "laprop", "signum", "sim_ademamix", "soap", "hybrid"]


@pytest.mark.parametrize("kind", KINDS)
def test_resumed_run_is_bit_identical(kind):
    straight = make_model(kind, 1)
    first = copy.deepcopy(straight)
    grads = make_grads(straight)
    run(straight, build(kind, straight), grads)

    opt = build(kind, first)
    run(first, opt, grads[:SAVE_AT])
    saved = roundtrip(opt.state_dict())
    # A fresh model copy and a fresh optimizer built with other options: the
    # state dict's group values (lr, weight decay, ...) are the ones in force.
    resumed = copy.deepcopy(first)
    opt2 = build(kind, resumed, lr=0.5)
    opt2.load_state_dict(saved)
    for g2, g in zip(opt2.param_groups, opt.param_groups):
        assert g2["lr"] == g["lr"]
    # Going on with the original optimizer does not touch what was loaded.
    run(first, opt, grads[SAVE_AT:SAVE_AT + 1])
    run(resumed, opt2, grads[SAVE_AT:])
    want = dict(straight.named_parameters())
    for n, p in resumed.named_parameters():
        assert torch.equal(p, want[n]), n
    for p in resumed.parameters():
        assert opt2.state[p]["step"] == STEPS


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_has_torch_optim_format(kind):
    model = make_model(kind, 2)
    opt = build(kind, model)
    run(model, opt, make_grads(model)[:2])
    sd = opt.state_dict()
    assert set(sd) >= {"state", "param_groups"}
    params = list(model.parameters())
    indices = [i for g in sd["param_groups"] for i in g["params"]]
    assert indices == list(range(len(params)))
    assert len(sd["param_groups"]) == len(opt.param_groups)
    for g, live in zip(sd["param_groups"], opt.param_groups):
        assert all(isinstance(i, int) for i in g["params"])
        assert len(g["params"]) == len(live["params"])
        assert g["lr"] == live["lr"]
    assert sorted(sd["state"]) == list(range(len(params)))
    order = [p for g in opt.param_groups for p in g["params"]]
    kind_of = {i: g.get("optimizer") for g in sd["param_groups"] for i in g["params"]}
    for i, s in sd["state"].items():
        assert isinstance(i, int)
        p = order[i]
        if kind == "hybrid":
            assert kind_of[i] in ("muon", "adamw")
            keys = {"step", "momentum_buffer"} if kind_of[i] == "muon" else {"step", "exp_avg", "exp_avg_sq"}
        else:
            keys = STATE_KEYS[kind]
        assert set(s) == keys, (i, set(s))
        assert int(s["step"]) == 2
        for k in keys - {"step"}:
            assert isinstance(s[k], torch.Tensor)
        # SOAP keeps its moments as the matrix it sees: dim 0 by the rest.
        shape = (p.shape[0], p[0].numel()) if kind == "soap" else p.shape
        for k in keys & {"momentum_buffer", "exp_avg", "exp_avg_sq"}:
            assert s[k].shape == shape and s[k].dtype == p.dtype, (i, k)
    # The live state is keyed by the parameters themselves, as torch.optim's.
    for p in params:
        assert p in opt.state


def test_hybrid_state_dict_routes_as_expected():
    model = make_model("hybrid", 3)
    opt = build("hybrid", model)
    run(model, opt, make_grads(model)[:1])
    named = dict(model.named_parameters())
    for n in ("fc1.weight", "fc2.weight"):
        assert set(opt.state[named[n]]) == {"step", "momentum_buffer"}, n
    for n in ("embed.weight", "lm_head.weight", "norm.weight", "fc1.bias"):
        assert set(opt.state[named[n]]) == {"step", "exp_avg", "exp_avg_sq"}, n


@pytest.mark.parametrize("kind", ["muon", "lion", "adamuon"])
def test_load_rejects_mismatched_groups_and_changes_nothing(kind):
    model = make_model(kind, 4)
    opt = build(kind, model)
    run(model, opt, make_grads(model)[:1])
    sd = roundtrip(opt.state_dict())
    torch.manual_seed(5)
    a = nn.Parameter(torch.randn(12, 8))
    b = nn.Parameter(torch.randn(6, 10))
    c = nn.Parameter(torch.randn(6, 10))
    cls = {"muon": muon_cpp.Muon, "lion": muon_cpp.Lion, "adamuon": muon_cpp.AdaptiveMuon}[kind]
    extra = dict(mode="adamuon") if kind == "adamuon" else {}
    # Same group count, other sizes (1 + 2 against 2 + 1).
    other = cls([dict(params=[a]), dict(params=[b, c])], lr=0.125, **extra)
    with pytest.raises(ValueError):
        other.load_state_dict(sd)
    assert [g["lr"] for g in other.param_groups] == [0.125, 0.125]
    assert all(len(other.state.get(p, {})) == 0 for p in (a, b, c))
    # Another group count.
    one = cls([a, b, c], lr=0.125, **extra)
    with pytest.raises(ValueError):
        one.load_state_dict(sd)
    assert one.param_groups[0]["lr"] == 0.125
    # Both still step normally afterwards.
    for p in (a, b, c):
        p.grad = torch.randn_like(p)
    before = a.detach().clone()
    one.step()
    assert not torch.equal(a.detach(), before)


@pytest.mark.parametrize("kind", ["muon", "hybrid"])
def test_scheduler_state_saved_alongside(kind, tmp_path):
    straight = make_model(kind, 6)
    first = copy.deepcopy(straight)
    grads = make_grads(straight)

    def with_sched(model):
        opt = build(kind, model)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    opt_a, sched_a = with_sched(straight)
    run(straight, opt_a, grads, sched_a)

    opt_b, sched_b = with_sched(first)
    run(first, opt_b, grads[:SAVE_AT], sched_b)
    path = tmp_path / "checkpoint.pt"
    torch.save({"optimizer": opt_b.state_dict(), "scheduler": sched_b.state_dict()}, path)

    resumed = copy.deepcopy(first)
    opt_c, sched_c = with_sched(resumed)
    ckpt = torch.load(path)
    opt_c.load_state_dict(ckpt["optimizer"])
    sched_c.load_state_dict(ckpt["scheduler"])
    assert [g["lr"] for g in opt_c.param_groups] == [g["lr"] for g in opt_b.param_groups]
    run(resumed, opt_c, grads[SAVE_AT:], sched_c)
    assert [g["lr"] for g in opt_c.param_groups] == [g["lr"] for g in opt_a.param_groups]
    assert sched_c.last_epoch == sched_a.last_epoch == STEPS
    want = dict(straight.named_parameters())
    for n, p in resumed.named_parameters():
        assert torch.equal(p, want[n]), n


@pytest.mark.parametrize("mode", ["normuon", "adamuon"])
def test_load_refuses_a_second_moment_that_does_not_fit_and_changes_nothing(mode):
    # NorMuon keeps a rows x 1 second moment, AdaMuon rows x cols, in fp32:
    # any other shape or dtype would be taken and fail every later step.
    torch.manual_seed(5)
    p = torch.randn(8, 6, requires_grad=True)
    opt = muon_cpp.AdaptiveMuon([p], lr=0.02, mode=mode)
    p.grad = torch.randn_like(p)
    opt.step()
    good = opt.state_dict()
    kept = opt.state[p]["second_moment"].clone()
    shape = (8, 1) if mode == "normuon" else (8, 6)
    assert tuple(kept.shape) == shape
    # (torch.optim's load_state_dict casts state to the parameter's dtype
    # first, so only shapes can be wrong here.)
    for bad in (torch.zeros(3, 3), torch.zeros(8, 6 if mode == "normuon" else 1), torch.zeros(8)):
        sd = copy.deepcopy(good)
        sd["state"][0]["second_moment"] = bad
        with pytest.raises(ValueError) as e:
            opt.load_state_dict(sd)
        msg = str(e.value)
        assert "second_moment" in msg and mode in msg and len(msg) < 300, msg
        assert torch.equal(opt.state[p]["second_moment"], kept)
    # Still steps, and the good state loads.
    opt.load_state_dict(good)
    p.grad = torch.randn_like(p)
    opt.step()


@pytest.mark.parametrize("kind", ["muon", "hybrid"])
def test_replacing_a_parameter_in_param_groups_is_refused(kind):
    # The engine steps the tensors it was built with: a tensor swapped into
    # param_groups would never be stepped while the old one still is. Refused
    # at the next step (and load_state_dict) before anything changes.
    torch.manual_seed(6)
    p = torch.randn(6, 4, requires_grad=True)
    q = torch.randn(6, 4, requires_grad=True)
    if kind == "muon":
        opt = muon_cpp.Muon([p], lr=0.02)
    else:
        opt = muon_cpp.MuonWithAdamW([("w", p)], lr=0.02)
    opt.param_groups[0]["params"][0] = q
    p.grad = torch.randn_like(p)
    q.grad = torch.randn_like(q)
    before_p, before_q = p.detach().clone(), q.detach().clone()
    with pytest.raises(ValueError) as e:
        opt.step()
    msg = str(e.value)
    assert "param_groups[0]['params'][0]" in msg and "replaced" in msg and len(msg) < 300, msg
    assert torch.equal(p, before_p) and torch.equal(q, before_q)
    with pytest.raises(ValueError):
        opt.load_state_dict(opt.state_dict())
    opt.param_groups[0]["params"][0] = p
    opt.step()
    assert not torch.equal(p, before_p) and torch.equal(q, before_q)
