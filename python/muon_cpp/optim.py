"""The optimizers: ``torch.optim.Optimizer`` subclasses over the C++ engine.

Every optimizer here keeps torch.optim's data model:

* ``param_groups``: a list of dicts with ``params``, ``names``, ``optimizer``
  (the registry name), ``lr``, ``weight_decay`` and the optimizer's option
  keys (``option_fields(name)``). User code and ``torch.optim.lr_scheduler``
  edit them; the next ``step()`` takes the edit. A bad value raises
  ValueError at that step, naming the group and the key, and changes nothing.
* ``state[p]``: a dict of ordinary tensors (``momentum_buffer``, ``exp_avg``,
  ...) plus ``step``: the very tensors the C++ step updates in place.
* ``state_dict()`` / ``load_state_dict()`` in torch.optim's format.
* ``step(closure=None)``: one call into C++ for every parameter, with the
  GIL released.
* ``add_param_group``, ``copy.deepcopy``, the step and state-dict hooks of
  torch 2.x, ``zero_grad`` and every ``torch.optim.lr_scheduler``: see
  docs/python.md, "torch.optim's contract".
"""
import copy
import json
import operator
import os

import torch

from . import _C
from . import _dtensor as _dt
from . import _loading
from . import distributed as _dist

__all__ = ["Optimizer", "Muon", "AdaptiveMuon", "Lion", "LaProp", "Signum", "SimAdEMAMix", "SOAP",
           "PolarGrad", "Scion", "MOP", "SPEL", "MuonHyperball", "MuonWithAdamW", "make_optimizer",
           "explain", "option_fields"]

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


def option_fields(optimizer):
    """The option keys of a param group of ``optimizer`` (a registry name): a list
    of dicts with name, type, default, doc, choices, requirement, per_parameter."""
    return _C.group_fields(optimizer)


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


class Optimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step runs in the muon-cpp engine.

    Built by the classes below and by ``make_optimizer``. ``add_param_group``
    rebuilds the engine over every group, keeping each existing parameter's
    state (one process only; see docs/python.md).
    """

    # A subclass sets {registry name: settings} before Optimizer.__init__: the
    # settings a group added by add_param_group starts from. With one kind
    # they are also torch.optim's ``defaults`` (CyclicLR and OneCycleLR look
    # for "momentum" there).
    _group_defaults = None

    def __init__(self, groups, config, layout=None):
        # groups: dicts with params, names, optimizer and complete settings.
        self._engine = None
        names = {}
        for g in groups:
            for n, p in zip(g["names"], g["params"]):
                names[id(p)] = n
        # DTensor (FSDP2) parameters: the engine steps their local tensors in
        # the sharded layout, each matrix's rows split as the DTensor says.
        self._dtensors = {id(p): _dt.Local(p, names[id(p)])
                          for g in groups for p in g["params"] if _dt.is_dtensor(p)}
        layout = _dist._layout_of(layout, config, self._dtensor_shards(groups))
        layout.apply_to(config)
        c_layout = layout.build(names)
        kinds = self._group_defaults or {}
        super().__init__(groups, dict(next(iter(kinds.values()))) if len(kinds) == 1 else {})
        self._config = config
        self._layout = layout
        self._engine = self._new_engine(c_layout)
        # The tensors the engine steps, group by group: they cannot be
        # replaced in param_groups (checked at every step).
        self._built_params = [tuple(g["params"]) for g in self.param_groups]

    def _new_engine(self, c_layout):
        specs = []
        for g in self.param_groups:
            specs.append({
                "optimizer": g["optimizer"],
                "names": list(g["names"]),
                "params": [self._engine_param(p) for p in g["params"]],
                "settings": {k: v for k, v in g.items() if k in self._option_keys(g["optimizer"])},
            })
        return _C.Engine(specs, self._config, c_layout)

    @staticmethod
    def _option_keys(kind):
        return {f["name"] for f in _C.group_fields(kind)}

    def _single_process(self, what):
        """Raises ValueError unless this optimizer steps every parameter whole
        in this process (no distributed layout, no DTensor parameters)."""
        if self._dtensors or type(self._layout) is not _dist._NoLayout:
            kind = "DTensor (FSDP2) parameters" if self._dtensors else \
                f"the {type(self._layout).__name__} layout"
            raise ValueError(f"{what} is supported in one process only, not with {kind}: build a "
                             f"new optimizer with every group on every rank")

    def _rebuild(self):
        """A new engine over every group of param_groups, each parameter's
        state loaded from self.state (copied bit for bit)."""
        names = {id(p): n for g in self.param_groups for n, p in zip(g["names"], g["params"])}
        engine = self._new_engine(self._layout.build(names))
        engine.load_state({self._engine_param(p): self._local_state(p, s)
                           for p, s in self.state.items() if s})
        self._engine = engine
        self._built_params = [tuple(g["params"]) for g in self.param_groups]
        self._refresh_state()

    def _check_params(self):
        """Raises ValueError if a tensor in param_groups is not the one the
        optimizer was built with: the engine would go on stepping the old
        tensor and never the new one."""
        for i, (g, built) in enumerate(zip(self.param_groups, self._built_params)):
            params = g.get("params", ())
            if len(params) != len(built):
                continue  # the engine names this one (parameters added or removed)
            if all(map(operator.is_, params, built)):
                continue  # every step: one pass at C speed
            for j, (now, was) in enumerate(zip(params, built)):
                if now is not was:
                    shape = list(getattr(now, "shape", ()))
                    raise ValueError(
                        f"param_groups[{i}]['params'][{j}] is not the tensor this optimizer was "
                        f"built with (now {type(now).__name__} of shape {shape[:8]}, built with "
                        f"shape {list(was.shape)[:8]}); parameters cannot be replaced after "
                        f"construction: build a new optimizer")

    def _dtensor_shards(self, groups):
        """RowShards of the DTensor parameters that go to a Muon-family optimizer."""
        shards = {}
        for g in groups:
            if g["optimizer"] not in _ROW_SHARDED:
                continue
            for p in g["params"]:
                local = self._dtensors.get(id(p))
                if local is not None:
                    shards[p] = _dist.RowShard(tuple(p.shape), local.group)
        return shards if self._dtensors else None

    def _engine_param(self, p):
        """The tensor the engine steps for ``p``: its local alias for a DTensor."""
        local = self._dtensors.get(id(p))
        return p if local is None else local.held

    # ---- construction helpers -------------------------------------------------------

    @staticmethod
    def _complete(kind, groups, defaults, config):
        """Each group's settings: `defaults` then the group's own keys, checked
        and completed by the engine (ValueError naming a bad key or value)."""
        fields = {f["name"]: f for f in _C.group_fields(kind)}
        out = []
        for gi, g in enumerate(groups):
            given = dict(defaults)
            given.update({k: v for k, v in g.items() if k not in _STRUCTURAL})
            try:
                settings = _group_settings(kind, given, config)
            except ValueError as e:
                raise ValueError(f"param group {gi}: {e}" if len(groups) > 1 else str(e)) from None
            out.append(dict(settings, params=g["params"], names=g["names"], optimizer=kind))
        # Whole-run options hold for every group of the optimizer.
        for key, f in fields.items():
            if not f["per_parameter"]:
                values = {repr(g[key]) for g in out}
                if len(values) > 1:
                    raise ValueError(f"{key} is a whole-run option of {kind} and must be the same "
                                     f"in every param group, got {sorted(values)}")
        return out

    # ---- torch.optim.Optimizer -------------------------------------------------------

    def add_param_group(self, param_group):
        """torch.optim's add_param_group: the next step updates the new group.

        The group's settings start from the construction's (``lr``,
        ``weight_decay`` and the options given to the constructor) and are
        checked as construction checks them (ValueError naming the key and
        value; on error nothing changed). Its parameters are named by
        ``names`` (a list), by (name, tensor) pairs in ``params``, or else
        ``"group{g}.param{i}"`` (g: the new group's index, i: the parameter's
        in it). ``optimizer`` (a registry name this optimizer steps) picks the
        kind; without it the parameters are routed as construction routes them
        (by name and shape), and must all go to one kind. The engine is
        rebuilt over every group; every existing parameter keeps its state
        (new tensors holding the same values). One process only: with a
        distributed layout or DTensor parameters it raises ValueError.
        """
        if getattr(self, "_engine", None) is None:
            super().add_param_group(param_group)  # construction
            return
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError("add_param_group: param_group must be a dict with 'params'")
        self._single_process("add_param_group")
        self._check_params()
        gi = len(self.param_groups)
        ps = param_group["params"]
        if isinstance(ps, set):
            raise TypeError("add_param_group: params must be an ordered collection, not a set")
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        if not ps:
            raise ValueError("add_param_group: the group has no parameters")
        names, tensors = _split_named(ps, "add_param_group")
        if names is None:
            names = param_group.get("names", param_group.get("param_names"))
            names = [f"group{gi}.param{i}" for i in range(len(tensors))] if names is None \
                else [str(n) for n in names]
        if len(names) != len(tensors):
            raise ValueError(f"add_param_group: {len(names)} names for {len(tensors)} params")
        held = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in held for p in tensors):
            raise ValueError("add_param_group: some parameters appear in more than one parameter "
                             "group")
        taken = {n for g in self.param_groups for n in g["names"]}
        clash = [n for n in names if n in taken] or \
            [n for i, n in enumerate(names) if n in names[:i]]
        if clash:
            raise ValueError(f"add_param_group: parameter name '{clash[0][:80]}' is already taken")
        given = {k: v for k, v in param_group.items()
                 if k not in _STRUCTURAL and k != "param_names"}
        kind, base = self._route(param_group.get("optimizer"), names, tensors)
        base = dict(base)
        base.update(given)
        try:
            settings = _group_settings(kind, base, self._config)
        except ValueError as e:
            raise ValueError(f"add_param_group: {e}") from None
        for f in _C.group_fields(kind):
            if f["per_parameter"]:
                continue
            for g in self.param_groups:
                if g["optimizer"] == kind and g[f["name"]] != settings[f["name"]]:
                    raise ValueError(f"add_param_group: {f['name']} is a whole-run option of "
                                     f"{kind} and must be the same in every param group: "
                                     f"{g[f['name']]!r}, got {settings[f['name']]!r}")
        before = len(self.param_groups)
        super().add_param_group(dict(settings, params=tensors, names=names, optimizer=kind))
        try:
            self._rebuild()
        except BaseException:
            del self.param_groups[before:]
            raise

    def _route(self, kind, names, params):
        """(registry name, settings to start from) of a group add_param_group adds."""
        defaults = self._group_defaults or {}
        kinds = {g["optimizer"] for g in self.param_groups} | set(defaults)
        if kind is not None:
            if kind not in kinds:
                raise ValueError(f"add_param_group: optimizer '{str(kind)[:60]}' is not one this "
                                 f"optimizer steps ({sorted(kinds)})")
            if kind in defaults:
                return kind, defaults[kind]
            plans = [p for p in self._plan(names, params) if p["optimizer"] == kind]
            return kind, plans[0]["settings"] if plans else {}
        plans = self._plan(names, params)
        routed = {p["optimizer"] for p in plans}
        if len(routed) > 1:
            where = "; ".join(f"{p['optimizer']}: {', '.join(p['names'])[:80]}" for p in plans)
            raise ValueError(f"add_param_group: the parameters go to more than one optimizer "
                             f"({where}); add one group per optimizer or pass 'optimizer'")
        kind = plans[0]["optimizer"]
        if kind not in kinds:
            raise ValueError(f"add_param_group: the parameters go to '{kind}', which this "
                             f"optimizer does not step ({sorted(kinds)}); pass 'optimizer'")
        return kind, defaults.get(kind, plans[0]["settings"])

    def _plan(self, names, params):
        """The config's plan (optimizer, settings) of the new parameters, planned
        with every parameter (as construction plans: an override rule must
        match some parameter)."""
        new = set(names)
        every = _C.plan_groups([n for g in self.param_groups for n in g["names"]] + list(names),
                               [p for g in self.param_groups for p in g["params"]] + list(params),
                               self._config)
        plans = []
        for p in every:
            mine = [n for n in p["names"] if n in new]
            if mine:
                plans.append({"optimizer": p["optimizer"], "names": mine,
                              "settings": p["settings"]})
        return plans

    def __deepcopy__(self, memo):
        """An independent optimizer over the copied parameters (mapped through
        ``memo``, as ``copy.deepcopy((model, opt))`` does) with a copy of the
        state and its own engine. One process only."""
        self._single_process("copy.deepcopy")
        self._check_params()
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k not in ("_engine", "_config", "_layout", "_dtensors", "_built_params"):
                new.__dict__[k] = copy.deepcopy(v, memo)
        new._engine = None
        new._dtensors = {}
        new._layout = self._layout
        new._config = _config_of(self._config)
        new._rebuild()
        return new

    @_no_dynamo
    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter with a gradient; ``closure`` (re-evaluates
        the loss) runs first with grad enabled and its loss is returned."""
        self._check_params()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._dtensors:
            for local in self._dtensors.values():
                local.sync()
            try:
                self._engine.step(self.param_groups, None)
            finally:
                for local in self._dtensors.values():
                    local.held.grad = None  # the DTensor keeps its gradient
            self._refresh_state()
        else:
            self._engine.step(self.param_groups, self.state)
        return loss

    @_no_dynamo
    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict):
        """torch.optim's load_state_dict; the state and the group values go to
        the engine, checked before anything changes (on error, nothing did)."""
        self._check_params()
        _loading.check_format(state_dict)
        saved_groups = state_dict["param_groups"]
        for i, (mine, theirs) in enumerate(zip(self.param_groups, saved_groups)):
            if "optimizer" in theirs and theirs["optimizer"] != mine["optimizer"]:
                raise ValueError(f"loaded state dict's param group {i} is for optimizer "
                                 f"{_loading.short(theirs['optimizer'], 40)}, this one's is "
                                 f"'{mine['optimizer']}'")
            missing = self._option_keys(mine["optimizer"]) - set(theirs)
            if missing:
                raise ValueError(_loading.lacks(i, missing, theirs, self))
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved_groups)} param groups, this "
                             f"optimizer has {len(self.param_groups)}")
        for i, (mine, theirs) in enumerate(zip(self.param_groups, saved_groups)):
            if len(mine["params"]) != len(theirs.get("params", ())):
                raise ValueError(f"loaded state dict's param group {i} has "
                                 f"{len(theirs.get('params', ()))} parameters, this optimizer's "
                                 f"has {len(mine['params'])}")
        old_groups = [dict(g) for g in self.param_groups]
        old_state = {p: dict(s) for p, s in self.state.items()}
        try:
            super().load_state_dict(state_dict)
            # Keep the construction's names: they identify parameters in the engine.
            for g, old in zip(self.param_groups, old_groups):
                g["names"] = old["names"]
                g["optimizer"] = old["optimizer"]
            self._engine.apply_groups(self.param_groups)
            self._engine.load_state({self._engine_param(p): self._local_state(p, s)
                                     for p, s in self.state.items() if s})
        except Exception:
            self.param_groups[:] = old_groups
            self.state.clear()
            self.state.update(old_state)
            self._engine.apply_groups(self.param_groups)
            raise
        self._refresh_state()

    def _local_state(self, p, s):
        local = self._dtensors.get(id(p))
        if local is None:
            return s
        return {k: local.local_state(k, v) for k, v in s.items()}

    def _refresh_state(self):
        self.state.clear()
        for g in self.param_groups:
            for p in g["params"]:
                local = self._dtensors.get(id(p))
                s = self._engine.state_of(p if local is None else local.held)
                if s is None:
                    continue
                if local is not None:
                    s = {k: local.wrap_state(k, v) for k, v in s.items()}
                self.state[p] = s

    # ---- extras ----------------------------------------------------------------------

    def state_bytes(self):
        """Bytes of optimizer state this rank holds."""
        return self._engine.state_bytes()

    def steps_here(self, param):
        """Whether this rank steps ``param`` (False for parameters another rank
        owns in the layer-wise layout)."""
        return self._engine.steps_here(self._engine_param(param))

    def owners(self):
        """Layer-wise layout: the rank owning each parameter, in order; else []."""
        return self._engine.owners()


class _OneOptimizer(Optimizer):
    """An optimizer of one registry kind over torch.optim-style params."""

    _kind = None
    _defaults = {}

    def __init__(self, params, lr, weight_decay, layout, nonfinite, options):
        config = _C.Config()
        config.set("optimizer", self._kind)
        config.set("nonfinite", nonfinite)
        defaults = dict(self._defaults)
        defaults.update(options)
        defaults["lr"] = lr
        defaults["weight_decay"] = weight_decay
        groups = self._complete(self._kind, _normalize_groups(params), defaults, config)
        try:
            self._group_defaults = {self._kind: _group_settings(self._kind, defaults, config)}
        except ValueError:
            self._group_defaults = {self._kind: defaults}  # every group overrides the bad value
        super().__init__(groups, config, layout)

    def _route(self, kind, names, params):
        if kind is not None and kind != self._kind:
            raise ValueError(f"add_param_group: optimizer '{str(kind)[:60]}': this optimizer "
                             f"steps '{self._kind}' only")
        return self._kind, self._group_defaults[self._kind]


class Muon(_OneOptimizer):
    """Muon: SGD-momentum whose update is orthogonalized by Newton–Schulz.

    ``Muon(params, lr=0.02, weight_decay=0.0, *, layout=None, nonfinite="error",
    **options)``: the options are the C++ registry's muon fields without the
    ``muon_`` prefix (``option_fields("muon")``): momentum=0.95, nesterov=True,
    momentum_style ("ema" | "classic"), weight_decay_mode ("decoupled" |
    "independent" | "l2" | "palm" | "spectral_clipped", with spectral_wd_beta=1,
    | "cautious": decay only where the update and the weight agree in sign),
    spectral_update ("none" | "clip" | "hardcap", with spectral_sigma_min=-1,
    spectral_sigma_max=1, spectral_hardcap_beta=1), coefficient_type ("quintic", ...),
    num_ns_steps (0: the set's default), ns_eps, ns_eps_mode ("add" | "clamp"),
    ns_compute_dtype ("float32" | "bfloat16" | "float64"), scale_mode
    ("shape_scaling" by default, as muon::MuonOptions), extra_scale_factor,
    stacked_experts, split_qkv, qkv_split_sizes, num_query_groups, num_heads (per-head
    Newton–Schulz: the rows in num_heads equal blocks, each orthogonalized alone; 0 off),
    tp_mode.
    Parameters must have at least 2 dimensions. ``layout``: a layout of
    ``muon_cpp.distributed``. torch.optim.Muon's ns_coefficients, ns_steps,
    eps and adjust_lr_fn are refused naming what this class takes instead
    (coefficient_type="custom" with ns_coefficient_a/_b/_c, num_ns_steps,
    ns_eps, scale_mode); muon_cpp.compat.torch.Muon takes them as torch does.
    """

    _kind = "muon"
    _defaults = {"scale_mode": "shape_scaling"}

    def __init__(self, params, lr=0.02, weight_decay=0.0, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class AdaptiveMuon(_OneOptimizer):
    """Muon with a NorMuon (per row, ``mode="normuon"``), AdaMuon (per element,
    ``mode="adamuon"``) or NAMO (one scalar per matrix, of the gradient norm,
    ``mode="namo"``) second moment; ``beta2`` and ``eps`` are its decay and
    epsilon (the same in every group). Other options as ``Muon``."""

    _kind = "adaptive_muon"
    _defaults = {"scale_mode": "shape_scaling"}

    def __init__(self, params, lr=0.02, weight_decay=0.0, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class Lion(_OneOptimizer):
    """Lion: the sign of an interpolated momentum, decoupled weight decay
    (options beta1=0.9, beta2=0.99)."""

    _kind = "lion"

    def __init__(self, params, lr=1e-4, weight_decay=0.0, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class LaProp(_OneOptimizer):
    """LaProp: a momentum of gradients normalized by the second moment, decoupled
    weight decay (options beta1=0.9, beta2=0.999, eps=1e-8, correct_bias=True;
    Emerging-Optimizers' defaults)."""

    _kind = "laprop"

    def __init__(self, params, lr=1e-3, weight_decay=0.0, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class Signum(_OneOptimizer):
    """Signum: the sign of a momentum (options momentum=0.9, nesterov=False,
    correct_bias=True, weight_decay_method="decoupled" | "independent" | "l2";
    Emerging-Optimizers' defaults)."""

    _kind = "signum"

    def __init__(self, params, lr=1e-3, weight_decay=0.0, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class SimAdEMAMix(_OneOptimizer):
    """Simplified AdEMAMix: (alpha·g + a theory-style momentum) over Adam's second
    moment (options beta1=0.9999, beta2=0.999, eps=1e-8, correct_bias=True,
    num_beta_fast_warmup_steps=0 (None is taken as 0: no warmup), min_beta_fast=0.9,
    alpha=2.0, weight_decay_method="decoupled" | "independent" | "l2";
    Emerging-Optimizers' defaults)."""

    _kind = "sim_ademamix"

    def __init__(self, params, lr=1e-3, weight_decay=0.0, *, layout=None, nonfinite="error",
                 **options):
        if "num_beta_fast_warmup_steps" in options and options["num_beta_fast_warmup_steps"] is None:
            options["num_beta_fast_warmup_steps"] = 0
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class SOAP(_OneOptimizer):
    """SOAP: Adam in the eigenbasis of Shampoo's Kronecker factors (Vyas et al. 2024),
    as Emerging-Optimizers' SOAP (options beta1=0.9, beta2=0.95, shampoo_beta=0.95,
    eps=1e-8, weight_decay_method="decoupled", use_nesterov=False,
    precondition_frequency=1, adam_warmup_steps=0, precondition_1d=False,
    correct_bias=True, correct_shampoo_beta_bias="auto", use_eigh=False,
    use_adaptive_criteria=False, adaptive_update_tolerance=1e-7, power_iter_steps=1,
    max_update_rms=0.0). A parameter with ndim >= 2 is one matrix (dim 0 by the rest);
    state per parameter: step, exp_avg, exp_avg_sq, L, R, Q_L, Q_R."""

    _kind = "soap"

    def __init__(self, params, lr=3e-3, weight_decay=0.01, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class Dion2(_OneOptimizer):
    """Dion2 (microsoft/dion): Newton–Schulz on the top ``fraction`` of the rows
    (rows <= cols) or columns of the momentum M ← M + G by L1 norm, those slices of
    M decayed by ``ef_decay`` (error feedback), and only they updated, by
    lr·sqrt(fan_out/fan_in) (``adjust_lr="spectral_norm"``; "rms_norm" 0.2·sqrt(max),
    None). Dion's keywords and defaults: fraction=0.25, ef_decay=0.95, epsilon=1e-8,
    adjust_lr="spectral_norm", flatten=False (3-D+ parameters are batches of matrices;
    True: one matrix dim 0 by the rest); plus coefficient_type="polar_express_5",
    num_ns_steps (0: 5), ns_compute_dtype="float32". Ties of the norms go to the
    lower index. State per parameter: step, momentum."""

    _kind = "dion2"

    def __init__(self, params, lr=0.01, weight_decay=0.01, *, layout=None, nonfinite="error",
                 **options):
        if "adjust_lr" in options and options["adjust_lr"] is None:
            options["adjust_lr"] = "none"
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class NorDion2(_OneOptimizer):
    """NorDion2 (microsoft/dion): Dion2 on rows always, with NorMuon's per-row
    normalization of the orthogonalized rows. Dion's keywords and defaults:
    fraction=0.25, mu=0.95 (error-feedback decay), muon_beta2=0.95, epsilon=1e-8,
    adjust_lr="spectral_norm", flatten=False. State per parameter: step, momentum,
    variance (one value per row)."""

    _kind = "nordion2"

    def __init__(self, params, lr=0.01, weight_decay=0.01, *, layout=None, nonfinite="error",
                 **options):
        if "adjust_lr" in options and options["adjust_lr"] is None:
            options["adjust_lr"] = "none"
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class PolarGrad(_OneOptimizer):
    """PolarGrad: Muon's momentum, Newton–Schulz, and the update scaled by
    <O, M> (the nuclear-norm estimate) times ``extra_scale_factor``
    (Emerging-Optimizers' defaults: lr=3e-4, weight_decay=0.01 decoupled,
    nesterov=False, quintic ×5). Other options as ``Muon``'s (``scale_mode``
    is not read); every layout."""

    _kind = "polargrad"

    def __init__(self, params, lr=3e-4, weight_decay=0.01, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class Scion(_OneOptimizer):
    """Scion: Muon's momentum (no Nesterov), Newton–Schulz scaled by
    sqrt(rows/cols)·``spectral_radius`` (default 1), weight decay fixed at 1
    decoupled (the Frank–Wolfe step p ← (1 − lr)·p − lr·update), as
    Emerging-Optimizers fixes it; lr=3e-4. ``weight_decay`` other than 1,
    ``weight_decay_mode`` other than "decoupled" or ``nesterov=True`` (given
    here, in a group, or set in ``param_groups`` later) raise ValueError naming
    them. Other options as ``Muon``'s (``scale_mode`` is not read); every layout."""

    _kind = "scion"
    _defaults = {"nesterov": False}

    def __init__(self, params, lr=3e-4, weight_decay=1.0, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class MOP(_OneOptimizer):
    """MOP: Muon's momentum, the exact polar factor U·Vᵀ by SVD, Muon's
    ``scale_mode`` (spectral by default) times ``extra_scale_factor``
    (Emerging-Optimizers' defaults: lr=3e-4, weight_decay=0.01, nesterov=False).
    Whole matrices only: one process or the layerwise layout."""

    _kind = "mop"

    def __init__(self, params, lr=3e-4, weight_decay=0.01, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class SPEL(_OneOptimizer):
    """SPEL: Muon's momentum, the unscaled Newton–Schulz update, then the weight
    re-orthogonalized by Newton–Schulz (Emerging-Optimizers' defaults: lr=3e-4,
    weight_decay=0.1, nesterov=False, quintic ×5). Other options as ``Muon``'s
    (``scale_mode`` and ``extra_scale_factor`` are not read); every layout."""

    _kind = "spel"

    def __init__(self, params, lr=3e-4, weight_decay=0.1, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class MuonHyperball(_OneOptimizer):
    """MuonHyperball: Muon's update normalized to the weight's norm R and the
    weight kept at norm R (``radius``: a fixed R, every weight rescaled to it
    when built; 0, the default, each weight's own norm; ``eps`` 1e-8).
    Emerging-Optimizers' Muon defaults: lr=3e-4, weight_decay=0.01,
    nesterov=False. Other options as ``Muon``'s; every layout."""

    _kind = "muon_hyperball"

    def __init__(self, params, lr=3e-4, weight_decay=0.01, *, layout=None, nonfinite="error",
                 **options):
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


def _named(named_parameters):
    items = list(named_parameters)
    names, params = _split_named(items, "named_parameters") if items else (None, [])
    if names is None:
        raise TypeError("named_parameters must be (name, tensor) pairs, e.g. "
                        "model.named_parameters()")
    return names, params


_ADAMW_ARGS = {"lr": "adamw_lr", "weight_decay": "adamw_weight_decay", "beta1": "adamw_betas[0]",
               "beta2": "adamw_betas[1]", "eps": "adamw_eps"}


class MuonWithAdamW(Optimizer):
    """Muon for the matrices, AdamW for 1-D parameters, embeddings and the output
    head (the registry's routing rules), in one optimizer.

    ``MuonWithAdamW(named_parameters, lr=0.02, weight_decay=0.0, *,
    adamw_lr=3e-4, adamw_betas=(0.9, 0.95), adamw_eps=1e-8,
    adamw_weight_decay=0.0, layout=None, nonfinite="error", **muon_options)``.

    ``add_param_group`` routes the new group's parameters by the same rules
    (name them with (name, tensor) pairs or ``names`` for the name rules), or
    takes ``"optimizer": "muon"`` or ``"adamw"``; its settings start from
    that kind's constructor arguments.
    """

    def __init__(self, named_parameters, lr=0.02, weight_decay=0.0, *, adamw_lr=3e-4,
                 adamw_betas=(0.9, 0.95), adamw_eps=1e-8, adamw_weight_decay=0.0, layout=None,
                 nonfinite="error", **muon_options):
        names, params = _named(named_parameters)
        if not (isinstance(adamw_betas, (tuple, list)) and len(adamw_betas) == 2):
            raise ValueError(f"adamw_betas must be a pair (beta1, beta2), got {adamw_betas!r}")
        config = _C.Config()
        config.set("optimizer", "muon")
        config.set("scalar_optimizer", "adamw")
        config.set("nonfinite", nonfinite)
        muon = {"scale_mode": "shape_scaling"}
        muon.update(muon_options)
        muon.update(lr=lr, weight_decay=weight_decay)
        muon = _group_settings("muon", muon, config)  # checks the names and values
        try:
            adamw = _C.group_settings("adamw", {"lr": adamw_lr, "weight_decay": adamw_weight_decay,
                                                "beta1": adamw_betas[0], "beta2": adamw_betas[1],
                                                "eps": adamw_eps}, config)
        except ValueError as e:
            # Name the argument the caller passed, not the AdamW group's key.
            text = str(e).split("] ", 1)[-1]
            key, _, rest = text.partition(" ")
            raise ValueError(f"{_ADAMW_ARGS.get(key, key)} {rest}") from None
        groups = []
        for plan in _C.plan_groups(names, params, config):
            settings = muon if plan["optimizer"] == "muon" else adamw
            groups.append(dict(settings, params=plan["params"], names=plan["names"],
                               optimizer=plan["optimizer"]))
        self._group_defaults = {"muon": muon, "adamw": adamw}
        super().__init__(groups, config, layout)


def make_optimizer(named_parameters, config, layout=None):
    """The optimizer ``config`` describes (a dict of config fields with optional
    "overrides", or a JSON file path; see docs/config.md) over
    ``named_parameters``: parameters grouped by their resolved settings, one
    param group per distinct setting. ``layout``: a layout of
    ``muon_cpp.distributed`` (or set by the config's own ``layout`` field when
    it needs nothing more)."""
    names, params = _named(named_parameters)
    c = _config_of(config)
    groups = []
    for plan in _C.plan_groups(names, params, c):
        groups.append(dict(plan["settings"], params=plan["params"], names=plan["names"],
                           optimizer=plan["optimizer"]))
    return Optimizer(groups, c, layout)


def explain(named_parameters, config):
    """One line per parameter: its optimizer, group, and the settings that differ
    from the config's (the override rules that matched)."""
    names, params = _named(named_parameters)
    return _C.explain(names, params, _config_of(config))
