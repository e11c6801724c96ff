"""Keller Jordan's ``MuonWithAuxAdam`` and ``SingleDeviceMuonWithAuxAdam``
(KellerJordan/Muon, muon.py at commit 00ba60d3a0d188993831f86e4d62597bb0e9b21c)
over the muon-cpp engine.

``from muon_cpp.compat.keller import MuonWithAuxAdam`` in place of
``from muon import MuonWithAuxAdam``: the same param groups, each flagged
``use_muon``; Muon groups take ``lr`` (0.02), ``momentum`` (0.95) and
``weight_decay`` (0), Adam groups ``lr`` (3e-4), ``betas`` ((0.9, 0.95)),
``eps`` (1e-10) and ``weight_decay`` (0), and no other keys. The step:

    Muon:  buf ← buf.lerp(g, 1 − momentum);  u = g.lerp(buf, momentum)
           (4-D: u viewed as (dim 0, the rest));  O = Newton–Schulz(u):
           bf16, X / (‖X‖_F + 1e-7), 5 iterations of (3.4445, −4.7750, 2.0315);
           O ← O·max(1, g.size(-2)/g.size(-1))^0.5
           p ← p·(1 − lr·wd);  p ← p − lr·O
    Adam:  m ← m.lerp(g, 1 − β1);  v ← v.lerp(g², 1 − β2);  t ← t + 1
           p ← p·(1 − lr·wd);  p ← p − lr·(m/(1 − β1^t)) / (√(v/(1 − β2^t)) + eps)

A parameter without a gradient steps with a zero gradient, as Keller's.
Ours: keyword ``ns_dtype`` (torch.bfloat16, as Keller's; torch.float32 or
torch.float64 run Newton–Schulz in that precision).
"""
import math

import torch

from .. import distributed as _dist
from ._facade import Facade, check_real, ns_dtype_name, short

__all__ = ["MuonWithAuxAdam", "SingleDeviceMuonWithAuxAdam"]

MUON_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0}
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0}
MUON_KEYS = {"params", "lr", "momentum", "weight_decay", "use_muon"}
ADAM_KEYS = {"params", "lr", "betas", "eps", "weight_decay", "use_muon"}


def _with_defaults(param_groups, first=0):
    """Copies of the user's groups with Keller's defaults filled in and his key
    checks (his asserts) as ValueError naming the group (its index: ``first``
    plus its position) and the keys."""
    if isinstance(param_groups, torch.Tensor) or isinstance(param_groups, dict):
        raise ValueError("param_groups should be a list of dicts, each with 'use_muon', got "
                         f"{type(param_groups).__name__}")
    groups = []
    for i, group in enumerate(param_groups, first):
        if not isinstance(group, dict):
            raise ValueError(f"param_groups[{i}] should be a dict, got {type(group).__name__}")
        if "use_muon" not in group:
            raise ValueError(f"param_groups[{i}] has no 'use_muon' key (True: Muon, False: Adam); "
                             f"keys: {short(sorted(group), 120)}")
        if not isinstance(group["use_muon"], bool):
            raise ValueError(f"param_groups[{i}]['use_muon'] should be True or False but is: "
                             f"{short(group['use_muon'])}")
        g = dict(group)
        defaults, keys = (MUON_DEFAULTS, MUON_KEYS) if g["use_muon"] else (ADAM_DEFAULTS, ADAM_KEYS)
        for k, v in defaults.items():
            g.setdefault(k, v)
        if set(g) != keys:
            extra = sorted(set(g) - keys)
            missing = sorted(keys - set(g))
            what = "Muon" if g["use_muon"] else "Adam"
            raise ValueError(f"param_groups[{i}] (use_muon={g['use_muon']}): a {what} group has "
                             f"exactly the keys {sorted(keys)}; unexpected: {short(extra, 120)}"
                             + (f", missing: {missing}" if missing else ""))
        groups.append(g)
    return groups


class _KellerBase(Facade):
    _scalar_optimizer = "adamw"

    def __init__(self, param_groups, ns_dtype, layout):
        self._ns_dtype = ns_dtype_name("ns_dtype", ns_dtype)
        groups = _with_defaults(param_groups)
        for i, g in enumerate(groups):
            self._check(g, i)
        super().__init__(groups, {}, layout)

    def add_param_group(self, param_group):
        """A group as the constructor takes them (``use_muon``, Keller's keys
        and defaults); see Facade.add_param_group."""
        if getattr(self, "_inner", None) is not None:
            param_group = _with_defaults([param_group], len(self.param_groups))[0]
            self._check(param_group, len(self.param_groups))
        super().add_param_group(param_group)

    def _required_keys(self, theirs):
        if "use_muon" not in theirs:
            return {"use_muon"}
        return (MUON_KEYS if theirs["use_muon"] is True else ADAM_KEYS) - {"params"}

    def _check_loaded_group(self, i, mine, theirs):
        if not (isinstance(theirs["use_muon"], bool) and theirs["use_muon"] == mine["use_muon"]):
            raise ValueError(f"load_state_dict: param_groups[{i}] has use_muon="
                             f"{short(theirs['use_muon'])}, this optimizer's has use_muon="
                             f"{mine['use_muon']}: the state_dict's groups are not this "
                             f"optimizer's (build it with the same groups)")

    def _check(self, g, i):
        where = f"param_groups[{i}]"
        lr = check_real(f"{where}['lr']", g["lr"], low=0.0)
        wd = check_real(f"{where}['weight_decay']", g["weight_decay"], low=0.0)
        if g["use_muon"]:
            momentum = check_real(f"{where}['momentum']", g["momentum"], low=0.0, high=1.0,
                                  high_open=True)
            return {"lr": lr, "weight_decay": wd, "momentum": momentum}
        betas = g["betas"]
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"{where}['betas'] should be a pair (beta1, beta2) but is: "
                             f"{short(betas)}")
        b1 = check_real(f"{where}['betas'][0]", betas[0], low=0.0, high=1.0, high_open=True)
        b2 = check_real(f"{where}['betas'][1]", betas[1], low=0.0, high=1.0, high_open=True)
        eps = check_real(f"{where}['eps']", g["eps"], low=0.0, low_open=True)
        return {"lr": lr, "weight_decay": wd, "beta1": b1, "beta2": b2, "eps": eps}

    def _engine_parts(self, group, index):
        values = self._check(group, index)
        if not group["use_muon"]:
            return [("adamw", values, list(group["params"]))]
        muon = dict(values, nesterov=True, momentum_style="ema", weight_decay_mode="decoupled",
                    coefficient_type="simple", num_ns_steps=5, ns_eps=1e-7, ns_eps_mode="add",
                    ns_compute_dtype=self._ns_dtype, scale_mode="shape_scaling",
                    extra_scale_factor=1.0, stacked_experts=False)
        # One engine group per kind of shape, in the order of first appearance.
        parts = {}
        for p in group["params"]:
            if p.ndim == 2:
                key = ("matrix",)
            elif p.ndim == 3:
                key = ("batch",)  # Keller's Newton–Schulz is batched over dim 0
            elif p.ndim == 4:
                key = ("conv", p.shape[0], p[0].numel(), p.shape[2], p.shape[3])
            else:
                raise ValueError(f"param_groups[{index}]: a Muon parameter must have 2, 3 or 4 "
                                 f"dimensions, got one of shape {list(p.shape)[:8]}")
            parts.setdefault(key, []).append(p)
        out = []
        for key, params in parts.items():
            s = dict(muon)
            if key[0] == "batch":
                s["stacked_experts"] = True
            elif key[0] == "conv":
                # Keller scales a 4-D update by max(1, kh/kw)^0.5 (the last two
                # dimensions), the engine a convolution from its 2-D view
                # (rows, cols): unit_rms_norm's √(rows/cols) times this factor
                # is his scale.
                rows, cols, kh, kw = key[1:]
                s["scale_mode"] = "unit_rms_norm"
                s["extra_scale_factor"] = math.sqrt(max(1.0, kh / kw)) * math.sqrt(cols / rows)
            out.append(("muon", s, params))
        return out

    def _before_step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)


class SingleDeviceMuonWithAuxAdam(_KellerBase):
    """Keller Jordan's SingleDeviceMuonWithAuxAdam over the muon-cpp engine:
    ``SingleDeviceMuonWithAuxAdam(param_groups, *, ns_dtype=torch.bfloat16)``,
    every group a dict with ``use_muon`` (see the module's docstring)."""

    def __init__(self, param_groups, *, ns_dtype=torch.bfloat16):
        super().__init__(param_groups, ns_dtype, None)


class MuonWithAuxAdam(_KellerBase):
    """Keller Jordan's MuonWithAuxAdam over the muon-cpp engine:
    ``MuonWithAuxAdam(param_groups, *, ns_dtype=torch.bfloat16)``.

    Over torch.distributed's default group when it is initialized with more
    than one process: every parameter in muon_cpp's layer-wise layout (each
    owned by one rank, which steps it, then all-gathered). Keller's steps each
    Muon parameter on one rank (round-robin over them sorted by size) and
    all-gathers it, and Adam on every rank; muon_cpp balances the owners by
    cost. The result is SingleDeviceMuonWithAuxAdam's, bit for bit.
    Gradients must be the same on every rank (averaged first, e.g. by DDP),
    as for Keller's. Without an initialized group, or with one process, it
    is SingleDeviceMuonWithAuxAdam.
    """

    def __init__(self, param_groups, *, ns_dtype=torch.bfloat16):
        import torch.distributed as dist
        layout = None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            layout = _dist.Layerwise(group=None)
        super().__init__(param_groups, ns_dtype, layout)
