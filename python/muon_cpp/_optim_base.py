"""muon_cpp.optim.Optimizer: the torch.optim.Optimizer over the C++ engine that
every optimizer of muon_cpp.optim is (see muon_cpp.optim's docstring)."""
import copy
import operator

import torch

from . import _C
from . import _dtensor as _dt
from . import _loading
from . import distributed as _dist
from ._optim_common import _ROW_SHARDED, _STRUCTURAL, _config_of, _group_settings, _no_dynamo, _split_named


class Optimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose step runs in the muon-cpp engine.

    Built by the classes of muon_cpp.optim and by ``make_optimizer``. ``add_param_group``
    rebuilds the engine over every group, keeping each existing parameter's
    state (one process only; see docs/python.md).
    """

    # A subclass sets {registry name: settings} before Optimizer.__init__: the
    # settings a group added by add_param_group starts from. With one kind
    # they are also torch.optim's ``defaults`` (CyclicLR and OneCycleLR look
    # for "momentum" there).
    _group_defaults = None
    # Its public name, muon_cpp.optim.Optimizer (pickles, load_state_dict's messages).
    __module__ = "muon_cpp.optim"

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

