"""A torch.optim.Optimizer with another implementation's param group keys over
the muon-cpp engine.

The user's ``param_groups`` keep the keys the original optimizer names
(``group["momentum"]``, ``group["ns_steps"]``, ...); each user group is
stepped by one or more engine groups of a ``muon_cpp.optim.Optimizer``
whose settings are computed from the user group's values before every step,
so an edit of a user group (a scheduler, user code) takes effect at the next
step. ``state`` is the engine optimizer's state (the same dicts of tensors).
"""
import copy
import math
import numbers

import torch

from .. import _C
from .. import _loading
from .. import optim as _optim


def short(value, limit=80):
    """repr(value), at most `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_real(name, value, low=None, high=None, low_open=False, high_open=False):
    """float(value), or ValueError naming `name` and the value: a finite real in
    the range (low, high), each end open or closed."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low}, "
        hi = "" if high is None else f"{high}" + (")" if high_open else "]")
        want = f"in {lo}{hi}" if low is not None and high is not None else (
            f"{'>' if low_open else '>='} {low}" if low is not None else "finite")
        raise ValueError(f"{name} should be a finite number {want} but is: {short(value)}")
    return float(value)


NS_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}


def ns_dtype_name(name, value):
    if value not in NS_DTYPES:
        raise ValueError(f"{name} should be torch.bfloat16, torch.float32 or torch.float64 but "
                         f"is: {short(value)}")
    return NS_DTYPES[value]


class Facade(torch.optim.Optimizer):
    """Subclasses define ``_engine_parts(group, index)``: a list of
    ``(kind, settings, params)`` for one user group, after checking its values
    (ValueError naming the group's key and value)."""

    _scalar_optimizer = None

    def __init__(self, params, defaults, layout=None):
        self._inner = None
        super().__init__(params, defaults)
        self._layout_given = layout
        self._inner, self._parts = self._build_inner()
        self.state = self._inner.state

    def _build_inner(self):
        """The engine optimizer over every user group, and each user group's
        engine group indices (checked: ValueError naming a bad value)."""
        parts = []  # per user group: the engine groups' indices
        engine_groups = []
        config = _C.Config()
        config.set("optimizer", "muon")
        config.set("nonfinite", "error")
        plans = [self._engine_parts(g, i) for i, g in enumerate(self.param_groups)]
        kinds = {kind for plan in plans for kind, _, _ in plan}
        if self._scalar_optimizer and self._scalar_optimizer in kinds:
            config.set("scalar_optimizer", self._scalar_optimizer)
        name_of = {id(p): f"param_groups.{i}.{j}" for i, g in enumerate(self.param_groups)
                   for j, p in enumerate(g["params"])}
        for i, plan in enumerate(plans):
            indices = []
            for kind, settings, params in plan:
                names = [name_of[id(p)] for p in params]
                engine_groups.append(self._engine_group(kind, settings, params, names, config))
                indices.append(len(engine_groups) - 1)
            parts.append(indices)
        return _optim.Optimizer(engine_groups, config, self._layout_given), parts

    @staticmethod
    def _engine_group(kind, settings, params, names, config):
        return dict(_C.group_settings(kind, settings, config), params=list(params), names=names,
                    optimizer=kind)

    def _engine_settings(self):
        """Every engine group's settings from the user groups' current values
        (checked; nothing is changed here)."""
        out = {}
        for i, (g, indices) in enumerate(zip(self.param_groups, self._parts)):
            plan = self._engine_parts(g, i)
            if len(plan) != len(indices):
                raise ValueError(f"param_groups[{i}]: its parameters' grouping changed; "
                                 f"build a new optimizer")
            for (kind, settings, params), e in zip(plan, indices):
                engine = self._inner.param_groups[e]
                if kind != engine["optimizer"] or any(
                        a is not b for a, b in zip(params, engine["params"])) or len(params) != len(
                            engine["params"]):
                    raise ValueError(f"param_groups[{i}]: its parameters changed after "
                                     f"construction; build a new optimizer")
                out[e] = _C.group_settings(kind, settings, self._inner._config)
        return out

    def _sync(self):
        for e, settings in self._engine_settings().items():
            self._inner.param_groups[e].update(settings)

    def add_param_group(self, param_group):
        """torch.optim's add_param_group: the group takes the constructor's
        defaults for the keys it does not give, is checked as construction
        checks groups (ValueError naming the key and value; on error nothing
        changed), and the next step updates it. The engine is rebuilt over
        every group; every existing parameter keeps its state bit for bit.
        One process only (ValueError with a distributed layout)."""
        if getattr(self, "_inner", None) is None:
            super().add_param_group(param_group)  # construction
            return
        self._inner._single_process("add_param_group")
        self._sync()  # the existing groups' current values, checked
        before = len(self.param_groups)
        super().add_param_group(param_group)  # torch's checks and defaults
        try:
            inner, parts = self._build_inner()
            # The existing parameters come first in the same engine order:
            # their state moves over by index.
            saved = self._inner.state_dict()
            loaded = inner.state_dict()
            loaded["state"] = saved["state"]
            inner.load_state_dict(loaded)
        except BaseException:
            del self.param_groups[before:]
            raise
        self._inner, self._parts = inner, parts
        self.state = self._inner.state

    def _before_step(self):
        pass

    def __deepcopy__(self, memo):
        """An independent optimizer over the copied parameters (mapped through
        ``memo``, as ``copy.deepcopy((model, opt))`` does), with a copy of the
        state and its own engine. One process only."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = copy.deepcopy(v, memo)
        new.state = new._inner.state
        return new

    def zero_grad(self, set_to_none=True):
        """torch 2.x's default (gradients freed) on every torch version, as
        muon_cpp's own optimizers; set_to_none=False zeroes them in place."""
        super().zero_grad(set_to_none=set_to_none)

    @_optim._no_dynamo
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync()
        self._before_step()
        self._inner.step()
        self.state = self._inner.state
        return loss

    def load_state_dict(self, state_dict):
        """torch.optim's format (this class's group keys); checked before anything
        changes (on error, nothing did). torch 2.x's load_state_dict pre- and
        post-hooks run as torch.optim runs them."""
        for hook in getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        self._load_state_dict(state_dict)
        for hook in getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(self)

    # Keys of this class's groups a loaded group may lack (ours, which the
    # original's state_dicts do not have): they keep this optimizer's values.
    _optional_keys = frozenset()

    def _required_keys(self, theirs):
        """The keys a loaded param group must have to be one of this class's."""
        return set(self.defaults) - set(self._optional_keys)

    def _check_loaded_group(self, i, mine, theirs):
        """ValueError if loaded group ``theirs`` cannot replace group ``mine``."""

    def _load_state_dict(self, state_dict):
        _loading.check_format(state_dict)
        saved = state_dict["param_groups"]
        for i, (mine, theirs) in enumerate(zip(self.param_groups, saved)):
            missing = self._required_keys(theirs) - set(theirs)
            if missing:
                raise ValueError(_loading.lacks(i, missing, theirs, self))
            self._check_loaded_group(i, mine, theirs)
        if len(saved) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(saved)} param groups, this optimizer "
                             f"has {len(self.param_groups)}")
        new_groups = []
        for i, (mine, theirs) in enumerate(zip(self.param_groups, saved)):
            if len(mine["params"]) != len(theirs.get("params", ())):
                raise ValueError(f"loaded state dict's param group {i} has "
                                 f"{len(theirs.get('params', ()))} parameters, this optimizer's "
                                 f"has {len(mine['params'])}")
            g = {k: mine[k] for k in self._optional_keys if k in mine}
            g.update(theirs)
            g["params"] = mine["params"]
            new_groups.append(g)
        # The new values, checked as a step would check them.
        old_groups = self.param_groups
        self.param_groups = new_groups
        try:
            settings = self._engine_settings()
        finally:
            self.param_groups = old_groups
        # The saved state by parameter, re-indexed in the engine's order.
        index_of = {}
        for g, theirs in zip(self.param_groups, saved):
            for p, k in zip(g["params"], theirs["params"]):
                index_of[id(p)] = k
        inner_sd = self._inner.state_dict()
        saved_state = state_dict.get("state", {})
        state = {}
        k = 0
        for e, eg in enumerate(inner_sd["param_groups"]):
            eg.update(settings[e])
            for p in self._inner.param_groups[e]["params"]:
                s = saved_state.get(index_of[id(p)])
                if s:
                    state[k] = self._complete_state(p, dict(s))
                k += 1
        inner_sd["state"] = state
        self._inner.load_state_dict(inner_sd)
        for g, new in zip(self.param_groups, new_groups):
            g.update({key: v for key, v in new.items() if key != "params"})
        self.state = self._inner.state

    def _complete_state(self, p, s):
        return s

    # ---- extras ----------------------------------------------------------------------

    @property
    def engine(self):
        """The muon_cpp.optim.Optimizer that steps the parameters."""
        return self._inner
