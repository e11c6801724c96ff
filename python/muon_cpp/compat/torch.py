"""``torch.optim.Muon``'s signature over the muon-cpp engine.

``from muon_cpp.compat.torch import Muon`` in place of ``from torch.optim import
Muon``: the same arguments and defaults, the same param group keys, the same
step (torch/optim/_muon.py of pytorch/pytorch at commit
098e03f91de9384cc3afdf5c8b9a6bbc442bd66a), run by the C++ engine:

    buf ← buf.lerp(g, 1 − momentum)
    u = g.lerp(buf, momentum) if nesterov else buf
    O = Newton–Schulz(u): bf16, X / max(‖X‖_F, eps), tall matrices transposed,
        ns_steps iterations of X ← a·X + (b·A + c·A·A)·X with A = X·Xᵀ
    p ← p·(1 − lr·weight_decay)                      (the unadjusted lr)
    p ← p − lr·ratio·O,   ratio = √max(1, A/B)       (adjust_lr_fn None / "original")
                          ratio = 0.2·√max(A, B)     ("match_rms_adamw"),  (A, B) = p.shape

Ours beyond torch's: keyword ``ns_dtype`` (torch.bfloat16 by default, as torch;
torch.float32 or torch.float64 run Newton–Schulz in that precision), kept in
each param group. State per parameter: ``momentum_buffer`` (torch's key) and
``step`` (the engine's counter).
"""
import numbers

import torch

from ._facade import Facade, check_real, ns_dtype_name, short

__all__ = ["Muon"]

EPS = 1e-7
DEFAULT_A = 3.4445
DEFAULT_B = -4.7750
DEFAULT_C = 2.0315
DEFAULT_NS_STEPS = 5
_ADJUST = {None: "shape_scaling", "original": "shape_scaling", "match_rms_adamw": "match_rms_adamw"}


def _check_group(g, where):
    """The engine's muon settings of torch.optim.Muon group `g` (ValueError naming
    the key and its value)."""
    lr = check_real(f"{where}lr", g["lr"], low=0.0)
    wd = check_real(f"{where}weight_decay", g["weight_decay"], low=0.0)
    momentum = check_real(f"{where}momentum", g["momentum"], low=0.0, high=1.0, high_open=True)
    if not isinstance(g["nesterov"], bool):
        raise ValueError(f"{where}nesterov should be True or False but is: {short(g['nesterov'])}")
    coeffs = g["ns_coefficients"]
    if not (isinstance(coeffs, (tuple, list)) and len(coeffs) == 3):
        raise ValueError(f"{where}ns_coefficients should be a tuple of exactly 3 values (a, b, c) "
                         f"but is: {short(coeffs)}")
    a, b, c = (check_real(f"{where}ns_coefficients[{k}]", v) for k, v in enumerate(coeffs))
    eps = check_real(f"{where}eps", g["eps"], low=0.0, low_open=True)
    steps = g["ns_steps"]
    if not (isinstance(steps, numbers.Integral) and not isinstance(steps, bool)
            and 1 <= steps < 100):
        raise ValueError(f"{where}ns_steps should be an integer in [1, 100) but is: "
                         f"{short(steps)}")
    fn = g["adjust_lr_fn"]
    if not (fn is None or isinstance(fn, str)) or fn not in _ADJUST:
        raise ValueError(f"{where}adjust_lr_fn: Adjust learning rate function {short(fn)} is not "
                         f"supported (None, 'original' or 'match_rms_adamw')")
    dtype = ns_dtype_name(f"{where}ns_dtype", g["ns_dtype"])
    return {"lr": lr, "weight_decay": wd, "momentum": momentum, "nesterov": g["nesterov"],
            "momentum_style": "ema", "weight_decay_mode": "decoupled",
            "coefficient_type": "custom", "ns_coefficient_a": a, "ns_coefficient_b": b,
            "ns_coefficient_c": c, "num_ns_steps": int(steps), "ns_eps": eps,
            "ns_eps_mode": "clamp", "ns_compute_dtype": dtype, "scale_mode": _ADJUST[fn],
            "extra_scale_factor": 1.0}


class Muon(Facade):
    """torch.optim.Muon (torch >= 2.9) over the muon-cpp engine.

    ``Muon(params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
    ns_coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
    adjust_lr_fn=None, use_addmm=False, *, ns_dtype=torch.bfloat16)``.
    Only 2-D parameters (ValueError otherwise, torch's message). Checked at
    construction (torch checks some at the first step): lr >= 0, weight_decay
    >= 0, momentum in [0, 1) (torch takes any momentum >= 0), eps > 0,
    ns_steps an integer in [1, 100), ns_coefficients 3 finite numbers,
    adjust_lr_fn None, "original" or "match_rms_adamw". ``use_addmm`` is
    accepted and kept in the groups; it changes only how torch multiplies,
    not the result, and is not read. ``ns_dtype`` (ours): Newton–Schulz's
    compute dtype, torch.bfloat16 as torch, or torch.float32 / torch.float64.
    """

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(DEFAULT_A, DEFAULT_B, DEFAULT_C), eps=EPS,
                 ns_steps=DEFAULT_NS_STEPS, adjust_lr_fn=None, use_addmm=False, *,
                 ns_dtype=torch.bfloat16):
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError(f"Tensor lr must be 1-element, got shape {list(lr.shape)[:8]}")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                    "nesterov": nesterov, "ns_coefficients": ns_coefficients, "eps": eps,
                    "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn, "use_addmm": use_addmm,
                    "ns_dtype": ns_dtype}
        _check_group(defaults, "")
        super().__init__(params, defaults)

    # Ours, not in torch.optim.Muon's state_dicts (use_addmm, not read, is
    # not in every torch's): a loaded group without them keeps this one's.
    _optional_keys = frozenset({"ns_dtype", "use_addmm"})

    def _engine_parts(self, group, index):
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError("Muon only supports 2D parameters whereas we found a parameter "
                                 f"with size: {p.size()}")
        try:
            settings = _check_group(group, "")
        except ValueError as e:
            if len(self.param_groups) == 1:
                raise
            raise ValueError(f"param_groups[{index}]: {e}") from None
        return [("muon", settings, group["params"])]

    def _complete_state(self, p, s):
        # torch.optim.Muon saves only momentum_buffer; the engine counts steps.
        s.setdefault("step", 0)
        return s
