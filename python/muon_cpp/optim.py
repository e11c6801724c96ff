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
import torch  # noqa: F401

from . import _C
from ._optim_base import Optimizer
from ._optim_common import (  # noqa: F401
    _ROW_SHARDED,
    _STRUCTURAL,
    _TORCH_MUON_ARGS,
    _config_of,
    _group_settings,
    _is_named,
    _no_dynamo,
    _normalize_groups,
    _split_named,
)

__all__ = ["Optimizer", "Muon", "AdaptiveMuon", "Lion", "LaProp", "Signum", "ObliqueSGD",
           "ObliqueAdam", "SimAdEMAMix", "SOAP",
           "Dion", "Iso", "MOSO", "PolarGrad", "Scion", "MOP", "SPEL", "MuonHyperball", "MuonWithAdamW", "make_optimizer",
           "explain", "option_fields"]


def option_fields(optimizer):
    """The option keys of a param group of ``optimizer`` (a registry name): a list
    of dicts with name, type, default, doc, choices, requirement, per_parameter."""
    return _C.group_fields(optimizer)


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


class ObliqueSGD(_OneOptimizer):
    """Riemannian SGD with momentum on the oblique manifold: the slices of each
    parameter along ``dim`` are kept at unit L2 norm (Emerging-Optimizers'
    ObliqueSGD: u = g + momentum·u, projected on the tangent space, weight
    decay by weight_decay_method ("decoupled" | "independent" | "l2"), a step
    of lr, then renormalized with eps). Parameters need at least one dimension."""

    _kind = "oblique_sgd"

    def __init__(self, params, lr=1e-3, momentum=0.9, weight_decay=0.0, *,
                 weight_decay_method="decoupled", dim=0, eps=1e-8, layout=None,
                 nonfinite="error"):
        options = {"momentum": momentum, "weight_decay_method": weight_decay_method, "dim": dim,
                   "eps": eps}
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class ObliqueAdam(_OneOptimizer):
    """Riemannian Adam on the oblique manifold (Emerging-Optimizers'
    ObliqueAdam): as ObliqueSGD with u = (m / c1) / (sqrt(v) / c2 + eps), the
    moments' decays ``betas=(beta1, beta2)`` and c_i = 1 - beta_i^t with
    correct_bias (else 1). sqrt(v) is divided by c2, not sqrt(c2), as
    Emerging-Optimizers does."""

    _kind = "oblique_adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, *,
                 weight_decay_method="decoupled", dim=0, eps=1e-8, correct_bias=True,
                 layout=None, nonfinite="error"):
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        options = {"beta1": betas[0], "beta2": betas[1],
                   "weight_decay_method": weight_decay_method, "dim": dim, "eps": eps,
                   "correct_bias": correct_bias}
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


class _Dion2Family(_OneOptimizer):
    """Dion2 and NorDion2: lr=0.01, weight_decay=0.01, and Dion's adjust_lr=None
    read as "none"."""

    def __init__(self, params, lr=0.01, weight_decay=0.01, *, layout=None, nonfinite="error",
                 **options):
        if "adjust_lr" in options and options["adjust_lr"] is None:
            options["adjust_lr"] = "none"
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class Dion2(_Dion2Family):
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


class NorDion2(_Dion2Family):
    """NorDion2 (microsoft/dion): Dion2 on rows always, with NorMuon's per-row
    normalization of the orthogonalized rows. Dion's keywords and defaults:
    fraction=0.25, mu=0.95 (error-feedback decay), muon_beta2=0.95, epsilon=1e-8,
    adjust_lr="spectral_norm", flatten=False. State per parameter: step, momentum,
    variance (one value per row)."""

    _kind = "nordion2"


class Dion(_OneOptimizer):
    """Dion (microsoft/dion): low-rank orthonormal updates by power iteration on
    the momentum M ← M + G with a warm-started right factor Q, QR of P = M·Q
    (randomized Cholesky QR, ``qr_method="rcqr"``, or Householder ``"qr"``), error
    feedback M ← M − (1 − mu)·P·Rᵀ and Q ← R with unit columns; the update is
    lr·sqrt(rows/cols)·P·Qᵀ with decoupled weight decay. Dion's keywords and
    defaults: mu=0.95, rank_fraction=1.0, rank_multiple_of=1, epsilon=1e-8,
    power_iters=1, rcqr_oversample=1.25; plus seed=0 (Q's start and the sketches).
    Parameters of 3 or more dims are one matrix (dim 0 by the rest). State per
    parameter: step, momentum, Q."""

    _kind = "dion"

    def __init__(self, params, lr=0.01, mu=0.95, weight_decay=0.01, *, layout=None,
                 nonfinite="error", **options):
        options["mu"] = mu
        super().__init__(params, lr, weight_decay, layout, nonfinite, options)


class Iso(_OneOptimizer):
    """Iso (Emerging-Optimizers' isospectral optimizer): each matrix kept as
    U·diag(σ)·Vᵀ from its SVD at the first step; the gradients of the Stiefel
    factors, G·V·diag(σ) and Gᵀ·U·diag(σ), drive heavy-ball momenta, the factors
    are retracted (``retraction="qr"`` | ``"polar"`` | ``"cayley"``) and the
    parameter is overwritten with U·diag(σ)·Vᵀ (σ fixed). Emerging-Optimizers'
    keywords and defaults: lr=1e-3, momentum=0.9, retraction="qr"; no weight
    decay. Parameters of 3 or more dims are one matrix (dim 0 by the rest).
    State per parameter: step, u, sigma, v, momentum_u, momentum_v."""

    _kind = "iso"

    def __init__(self, params, lr=1e-3, momentum=0.9, retraction="qr", *, layout=None,
                 nonfinite="error", **options):
        options["momentum"] = momentum
        options["retraction"] = retraction
        super().__init__(params, lr, 0.0, layout, nonfinite, options)


class MOSO(_OneOptimizer):
    """MOSO (Emerging-Optimizers' Momentum One-Sided SOAP): Muon's momentum B,
    the covariance of B on its smaller side (bias-corrected EMA), its eigenbasis
    Q (eigh at the first step, then one orthogonal iteration), and RMSprop of
    Qᵀ·B in that basis rotated back; decoupled weight decay. Emerging-Optimizers'
    keywords and defaults: lr=3e-4, momentum=0.95, rms_beta=0.95,
    shampoo_beta=0.95, eps=1e-8, weight_decay=0.01, max_update_rms=0.0.
    Parameters of 3 or more dims are one matrix (dim 0 by the rest). State per
    parameter: step, momentum_buffer, exp_avg_sq, M, Q_M."""

    _kind = "moso"

    def __init__(self, params, lr=3e-4, momentum=0.95, rms_beta=0.95, shampoo_beta=0.95,
                 eps=1e-8, weight_decay=0.01, *, layout=None, nonfinite="error", **options):
        options.update(momentum=momentum, rms_beta=rms_beta, shampoo_beta=shampoo_beta, eps=eps)
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
