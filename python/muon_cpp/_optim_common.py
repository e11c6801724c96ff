"""Helpers of muon_cpp.optim: torch.optim's params argument as param groups,
configs, the engine's group settings (naming torch.optim.Muon's arguments
given to the Muon family) and the graph break around calls into C++."""
import json
import os

import torch

from . import _C
from . import _loading

# Keys of a param group that are not options.
_STRUCTURAL = ("params", "names", "optimizer")

# torch.optim.Muon's arguments that the Muon family spells otherwise: the
# field that takes each one's place, and how to give it.
_TORCH_MUON_ARGS = {
    "ns_coefficients": ("ns_coefficient_a", "coefficient_type='custom' with ns_coefficient_a=a, "
                        "ns_coefficient_b=b, ns_coefficient_c=c "
                        "(the same (a, b, c) at every step)"),
    "ns_steps": ("num_ns_steps", "num_ns_steps"),
    "eps": ("ns_eps", "ns_eps, with ns_eps_mode='clamp' for torch's X / max(|X|, eps)"),
    "adjust_lr_fn": ("scale_mode", "scale_mode ('shape_scaling' for None or 'original', or "
                     "'match_rms_adamw')"),
}


def _group_settings(kind, given, config):
    """_C.group_settings, after naming torch.optim.Muon's arguments given to
    the Muon family (ValueError saying what to give instead)."""
    fields = {f["name"] for f in _C.group_fields(kind)}
    for key, (field, instead) in _TORCH_MUON_ARGS.items():
        if key in given and key not in fields and field in fields:
            raise ValueError(f"{key}={_loading.short(given[key], 60)} is torch.optim.Muon's "
                             f"argument; '{kind}' takes {instead}; or use "
                             f"muon_cpp.compat.torch.Muon, which takes torch.optim.Muon's "
                             f"arguments")
    return _C.group_settings(kind, given, config)


# Optimizers whose matrices the sharded layout orthogonalizes whole.
_ROW_SHARDED = ("muon", "adaptive_muon", "polargrad", "scion", "mop", "spel", "muon_hyperball")


def _is_named(item):
    return (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)
            and isinstance(item[1], torch.Tensor))


def _split_named(items, where):
    """(names or None, tensors) of an iterable of tensors or of (name, tensor) pairs."""
    items = list(items)
    if all(_is_named(i) for i in items) and items:
        return [i[0] for i in items], [i[1] for i in items]
    for i in items:
        if not isinstance(i, torch.Tensor):
            raise TypeError(f"{where}: expected tensors or (name, tensor) pairs, got "
                            f"{type(i).__name__}")
    return None, items


def _normalize_groups(params):
    """torch.optim's params argument (tensors, named pairs, or dicts of either)
    as a list of dicts with 'params' (tensors) and 'names' (unique strings)."""
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors, (name, tensor) pairs or dicts, "
                        "got a single tensor")
    items = list(params)
    if not items:
        raise ValueError("params: the optimizer got an empty parameter list")
    groups = items if isinstance(items[0], dict) else [{"params": items}]
    out = []
    for gi, g in enumerate(groups):
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError(f"params[{gi}]: a param group must be a dict with 'params'")
        ps = g["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        names, tensors = _split_named(ps, f"param group {gi}")
        if names is None:
            names = list(g.get("names") or [f"param_groups.{gi}.{j}" for j in range(len(tensors))])
        if len(names) != len(tensors):
            raise ValueError(f"param group {gi}: {len(names)} names for {len(tensors)} params")
        rest = {k: v for k, v in g.items() if k not in ("params", "names")}
        out.append(dict(rest, params=tensors, names=names))
    return out


def _config_of(config):
    """A _C.Config from a dict, a JSON file path, or a _C.Config."""
    c = _C.Config()
    if config is None:
        return c
    if isinstance(config, _C.Config):
        c.apply_json(config.to_json())
    elif isinstance(config, dict):
        c.apply_json(json.dumps(config))
    elif isinstance(config, (str, os.PathLike)):
        c.load_file(os.fspath(config))
    else:
        raise TypeError(f"config must be a dict, a JSON file path or a muon_cpp config, "
                        f"got {type(config).__name__}")
    return c


def _no_dynamo(fn):
    """``fn`` run eagerly under torch.compile (torch 2.x): a graph break
    around the call into C++."""
    disable = getattr(torch, "_disable_dynamo", None)
    return fn if disable is None else disable(fn)

