"""What load_state_dict says when a state_dict is not this optimizer's: one
line naming the group, the keys it lacks, this class, and the class the
state_dict looks like it came from (by its groups' keys)."""
from collections.abc import Mapping


def short(value, limit=80):
    """repr(value), at most `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def class_name(optimizer):
    """The name a user imports ``optimizer``'s class by (muon_cpp.Muon for
    muon_cpp.optim.Muon)."""
    cls = type(optimizer)
    module = "muon_cpp" if cls.__module__ == "muon_cpp.optim" else cls.__module__
    return f"{module}.{cls.__qualname__}"


def check_format(state_dict):
    """ValueError unless ``state_dict`` has torch.optim's form: a dict whose
    'param_groups' is a list of dicts and whose 'state' (if any) is a dict."""
    if not isinstance(state_dict, Mapping):
        raise ValueError(f"load_state_dict: expected a torch.optim state_dict (a dict with 'state' "
                         f"and 'param_groups'), got {type(state_dict).__name__}")
    groups = state_dict.get("param_groups")
    if not isinstance(groups, (list, tuple)):
        raise ValueError(f"load_state_dict: the state_dict's 'param_groups' should be a list of "
                         f"dicts, got {type(groups).__name__}")
    if not isinstance(state_dict.get("state", {}), Mapping):
        raise ValueError(f"load_state_dict: the state_dict's 'state' should be a dict, got "
                         f"{type(state_dict['state']).__name__}")
    for i, g in enumerate(groups):
        if not isinstance(g, Mapping):
            raise ValueError(f"load_state_dict: param_groups[{i}] should be a dict, got "
                             f"{type(g).__name__}")


def looks_like(group):
    """Which optimizer's param group ``group`` looks like, by its keys."""
    keys = set(group)
    if "use_muon" in keys:
        return "Keller Jordan's MuonWithAuxAdam's (muon_cpp.compat.keller)"
    if {"optimizer", "names"} <= keys:
        return f"a muon_cpp optimizer's, a group of {short(group['optimizer'], 40)}"
    if {"ns_coefficients", "ns_steps"} <= keys:
        return "torch.optim.Muon's or muon_cpp.compat.torch.Muon's"
    if "dampening" in keys:
        return "torch.optim.SGD's"
    if {"betas", "amsgrad"} <= keys:
        return "torch.optim.Adam's or AdamW's"
    return "another optimizer's, with keys " + short(sorted(map(str, keys - {"params"})), 120)


def lacks(index, missing, group, optimizer):
    """The message for param group ``index`` of a loaded state_dict that lacks
    the keys ``missing`` that ``optimizer``'s groups have."""
    names = sorted(map(str, missing))
    listed = ", ".join(short(k, 40) for k in names[:4])
    if len(names) > 4:
        listed += f" and {len(names) - 4} more"
    return (f"load_state_dict: param_groups[{index}] lacks {listed}: this state_dict is not from "
            f"{class_name(optimizer)} (its group looks like {looks_like(group)})")
