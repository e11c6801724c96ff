"""muon_cpp.compat.torch.Muon against the real torch.optim.Muon (torch >= 2.9).

test_compat.py compares the class with a reference written from
torch/optim/_muon.py; here the peer is torch's own class, run on the same
inputs. Both are measured against the fp64 reference of the same step
(test_compat.torch_muon_ref) and ours must stay within BF16_FACTOR times
torch's own error (the derivation is test_compat's: both run Newton–Schulz
with bf16 roundings, ours at a subset of the places torch rounds).

The state_dict exchange is exact: a torch.optim.Muon state_dict loads into
ours and ours back into torch.optim.Muon with the same hyperparameters and
the same momentum buffers, bit for bit, and a torch.optim.Muon that went
through ours continues exactly as the one that did not.

The whole file skips (pytest exit 5) where torch has no torch.optim.Muon.
"""
import io
import os
import sys

import pytest
import torch

if not hasattr(torch.optim, "Muon"):
    pytest.skip("torch.optim.Muon needs torch >= 2.9", allow_module_level=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import max_diff  # noqa: E402
from test_compat import (BF16_FACTOR, TORCH_VARIANTS, make_grads, make_params,  # noqa: E402
                         torch_muon_ref)

from muon_cpp.compat.torch import Muon  # noqa: E402

# Tall, wide and square, and one of a transformer's proportions (4:1).
SHAPES = [(6, 10), (12, 5), (7, 7), (64, 16), (24, 96)]
HYPER = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
         "adjust_lr_fn")
# Every argument of torch.optim.Muon, one variant each (test_compat's), and
# all of them changed at once.
VARIANTS = dict(TORCH_VARIANTS, all_changed=dict(
    lr=0.03, weight_decay=0.05, momentum=0.9, nesterov=False, ns_coefficients=(3.0, -3.2, 1.2),
    eps=1e-6, ns_steps=4, adjust_lr_fn="match_rms_adamw"))


def leaves(values, dtype=torch.float32):
    return [torch.nn.Parameter(v.to(dtype).clone()) for v in values]


def run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.to(p.dtype).clone()
        opt.step()


def errors(ours, theirs, ref):
    """Each one's max |difference| from the fp64 reference."""
    return max_diff(ours, ref), max_diff(theirs, ref)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fp32_parameters_match_torch_optim_muon(variant):
    kw = dict(VARIANTS[variant])
    kw.setdefault("lr", 0.02)
    p0, grads = make_params(SHAPES, 11), make_grads(SHAPES, 11)
    ours, theirs = leaves(p0), leaves(p0)
    run(Muon(ours, **kw), ours, grads)
    run(torch.optim.Muon(theirs, **kw), theirs, grads)
    ref, _ = torch_muon_ref(p0, grads, torch.float64, **kw)
    worst = 0.0
    for x, y, r, w0 in zip(ours, theirs, ref, p0):
        e_ours, e_theirs = errors(x, y, r)
        assert e_theirs > 0
        assert e_ours <= BF16_FACTOR * e_theirs, (variant, tuple(x.shape), e_ours, e_theirs)
        # The bound tells a step apart: the step moved the parameter by far more.
        assert max_diff(r, w0) > 5 * e_theirs
        worst = max(worst, e_ours / e_theirs)
    print("largest_error_ratio:", worst)  # pytest -rP shows it


def test_bf16_parameters_match_torch_optim_muon():
    # bf16 parameters: both keep the momentum buffer in bf16 and round the
    # parameter to bf16 at each step (half an ulp, 2^-9 of |p|), the error
    # that dominates both. The fp64 reference starts from the same bf16 values.
    p0 = [p.to(torch.bfloat16).to(torch.float64) for p in make_params(SHAPES, 12)]
    grads = make_grads(SHAPES, 12)
    ours, theirs = leaves(p0, torch.bfloat16), leaves(p0, torch.bfloat16)
    # lr 0.1: the steps move the parameters by several of bf16's ulps.
    opt_ours, opt_theirs = Muon(ours, lr=0.1), torch.optim.Muon(theirs, lr=0.1)
    run(opt_ours, ours, grads)
    run(opt_theirs, theirs, grads)
    ref, _ = torch_muon_ref(p0, grads, torch.float64, lr=0.1)
    worst = 0.0
    for x, y, r, w0 in zip(ours, theirs, ref, p0):
        assert x.dtype == torch.bfloat16
        assert opt_ours.state[x]["momentum_buffer"].dtype == opt_theirs.state[y]["momentum_buffer"].dtype
        e_ours, e_theirs = errors(x, y, r)
        assert e_ours <= BF16_FACTOR * e_theirs, (tuple(x.shape), e_ours, e_theirs)
        # The step is coherent, the roundings are not: over the whole matrix
        # the step is several times their sum.
        assert (r - w0).norm() > 5 * (y.double() - r).norm()
        worst = max(worst, e_ours / e_theirs)
    print("largest_error_ratio:", worst)  # pytest -rP shows it


def test_named_parameters_as_torch_optim_muon():
    # torch >= 2.9 takes (name, tensor) pairs and keeps the names in the groups.
    p0, grads = make_params(SHAPES[:2], 13), make_grads(SHAPES[:2], 13)
    ours, theirs = leaves(p0), leaves(p0)
    opt_ours = Muon([("a", ours[0]), ("b", ours[1])], lr=0.02)
    opt_theirs = torch.optim.Muon([("a", theirs[0]), ("b", theirs[1])], lr=0.02)
    assert opt_ours.param_groups[0]["param_names"] == opt_theirs.param_groups[0]["param_names"]
    run(opt_ours, ours, grads)
    run(opt_theirs, theirs, grads)
    ref, _ = torch_muon_ref(p0, grads, torch.float64, lr=0.02)
    for x, y, r in zip(ours, theirs, ref):
        e_ours, e_theirs = errors(x, y, r)
        assert e_ours <= BF16_FACTOR * e_theirs
    sd_ours, sd_theirs = opt_ours.state_dict(), opt_theirs.state_dict()
    assert sd_ours["param_groups"][0]["param_names"] == sd_theirs["param_groups"][0]["param_names"]


def saved(opt):
    """opt.state_dict() through torch.save and torch.load, as a checkpoint
    carries it (a live state dict shares the optimizer's tensors)."""
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer)


def same_hyperparameters(a, b):
    for ga, gb in zip(a.param_groups, b.param_groups):
        assert {k: ga[k] for k in HYPER} == {k: gb[k] for k in HYPER}


def same_buffers(opt_a, params_a, opt_b, params_b):
    for x, y in zip(params_a, params_b):
        assert torch.equal(opt_a.state[x]["momentum_buffer"], opt_b.state[y]["momentum_buffer"])


def test_state_dicts_exchanged_both_ways():
    kw = dict(lr=0.02, weight_decay=0.05, momentum=0.9, adjust_lr_fn="match_rms_adamw",
              ns_steps=4)
    p0, grads = make_params(SHAPES, 14), make_grads(SHAPES, 14)
    theirs = leaves(p0)
    torch_opt = torch.optim.Muon(theirs, **kw)
    run(torch_opt, theirs, grads[:2])

    # torch -> ours: another optimizer's settings, replaced by the state dict's.
    ours = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    ours_opt = Muon(ours)
    ours_opt.load_state_dict(saved(torch_opt))
    same_hyperparameters(ours_opt, torch_opt)
    same_buffers(ours_opt, ours, torch_opt, theirs)

    # ours -> torch: a fresh torch.optim.Muon takes our state dict.
    back = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    back_opt = torch.optim.Muon(back)
    back_opt.load_state_dict(saved(ours_opt))
    same_hyperparameters(back_opt, torch_opt)
    same_buffers(back_opt, back, torch_opt, theirs)

    bufs = [torch_opt.state[p]["momentum_buffer"].to(torch.float64) for p in theirs]
    start = [p.detach().to(torch.float64) for p in theirs]
    run(torch_opt, theirs, grads[2:])
    run(ours_opt, ours, grads[2:])
    run(back_opt, back, grads[2:])
    # Through ours and back, torch's optimizer continues bit for bit.
    for x, y in zip(back, theirs):
        assert torch.equal(x, y)
    # Ours continues from torch's state as torch does: the fp64 reference
    # from the loaded parameters and buffers, within the bf16 bound.
    ref, _ = torch_muon_ref(start, grads[2:], torch.float64, bufs0=bufs, **kw)
    for x, y, r in zip(ours, theirs, ref):
        e_ours, e_theirs = errors(x, y, r)
        assert e_ours <= BF16_FACTOR * e_theirs, (tuple(x.shape), e_ours, e_theirs)


def test_a_state_dict_for_other_shapes_is_refused_whole():
    p0, grads = make_params(SHAPES[:2], 15), make_grads(SHAPES[:2], 15)
    theirs = leaves(p0)
    torch_opt = torch.optim.Muon(theirs, lr=0.02)
    run(torch_opt, theirs, grads[:1])
    sd = torch_opt.state_dict()
    ours = leaves([p.t() for p in p0])  # transposed: same count, other shapes
    ours_opt = Muon(ours, lr=0.05)
    with pytest.raises(ValueError, match=r"momentum_buffer"):
        ours_opt.load_state_dict(sd)
    assert ours_opt.param_groups[0]["lr"] == 0.05
    assert not ours_opt.state
