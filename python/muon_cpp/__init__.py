"""muon_cpp: the muon-cpp Muon optimizer engine for PyTorch programs.

The optimizers are real ``torch.optim.Optimizer`` subclasses whose step runs
in the C++ engine (one call per step, GIL released)::

    import muon_cpp
    opt = muon_cpp.MuonWithAdamW(model.named_parameters(), lr=0.02, adamw_lr=3e-4)
    loss.backward(); opt.step(); opt.zero_grad()

``newton_schulz`` and ``scale_factor`` expose the numerical core;
``make_optimizer`` builds any registered optimizer from one config (dict or
JSON file) with per-parameter override rules; ``load_plugin`` loads a C++
shared library that registers more (muon/plugin.h), ``optimizer_names``
lists the registered ones, and ``state_schema``
says what an optimizer's per-parameter state is; ``muon_cpp.distributed`` has
the layouts over ``torch.distributed`` process groups.
"""
import torch  # noqa: F401  (loads LibTorch and registers its Python types first)

__version__ = "0.1.0"


def _torch_release(version):
    """(major, minor, patch) of a torch version string ("2.6.0+debian", "1.13.0a0")."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def _extension_problem(info):
    """Why the extension cannot serve the running torch, or None."""
    built = info["torch_version"]
    if _torch_release(built) != _torch_release(torch.__version__):
        return (f"muon_cpp's extension was built against LibTorch {built} but the running torch "
                f"is {torch.__version__}; rebuild it for this torch "
                "(pip install --no-build-isolation --force-reinstall .)")
    abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", info["cxx11_abi"])
    if bool(abi) != bool(info["cxx11_abi"]):
        return (f"muon_cpp's extension was built with _GLIBCXX_USE_CXX11_ABI={int(info['cxx11_abi'])} "
                f"but torch uses {int(abi)}; rebuild it for this torch")
    return None


try:
    from . import _C
    _problem = _extension_problem(_C.build_info())
except ImportError as e:
    _problem = f"muon_cpp's extension cannot be loaded: {str(e)[:200]}"
if _problem is not None:
    import sys as _sys
    # `python3 -m muon_cpp.doctor` must start to report it (while a module
    # run by -m is located, sys.argv[0] is "-m").
    if _sys.argv[:1] != ["-m"]:
        raise ImportError(_problem + " (python3 -m muon_cpp.doctor shows the details)")
    _C = None
# Only the doctor's start runs on without the extension.
if _C is not None:
    from ._C import (  # noqa: F401
        build_info,
        coefficient_set_aliases,
        coefficient_set_info,
        coefficient_set_names,
        coefficients,
        load_plugin,
        newton_schulz_cpu_kernels,
        newton_schulz_flops,
        newton_schulz_method,
        optimizer_names,
        scale_factor,
        scale_mode_names,
        set_whole_steps,
        state_schema,
        whole_steps,
    )
    from .optim import (  # noqa: F401
        AdaptiveMuon,
        Dion,
        Dion2,
        Iso,
        LaProp,
        Lion,
        MOP,
        MOSO,
        Muon,
        MuonHyperball,
        MuonWithAdamW,
        NorDion2,
        ObliqueAdam,
        ObliqueSGD,
        Optimizer,
        PolarGrad,
        SOAP,
        SPEL,
        Scion,
        Signum,
        SimAdEMAMix,
        explain,
        make_optimizer,
        option_fields,
    )
    from .soap_family import KlMSoap, KlSoap, REKLS, ReklsV3, StackedSoap, TpRekls  # noqa: F401
    from .psgd import PSGDPro  # noqa: F401
    from . import distributed  # noqa: F401
    from . import _checks


    def newton_schulz(x, coefficients="quintic", steps=None, eps=1e-7, eps_mode="add",
                      compute_dtype=torch.float32, method="auto", schedule="cycle",
                      safety_factor=1.0):
        """Orthogonalizes ``x`` (m×n, or a batch b×m×n) with a Newton–Schulz schedule.

        coefficients: a built-in set name (``coefficient_set_names()``) or a list of
        (a, b, c) tuples (then ``schedule`` 'cycle' | 'repeat_last' and
        ``safety_factor`` apply); steps: None for the set's default; eps and
        eps_mode ('add': X/(‖X‖+eps), 'clamp': X/max(‖X‖, eps)); compute_dtype:
        torch.float32, torch.bfloat16 or torch.float64; method: 'auto' |
        'standard' | 'gram'. Returns a new tensor of x's shape, dtype and device;
        bad values raise ValueError. The GIL is released while it runs.
        """
        return _C.newton_schulz(x, coefficients=coefficients, steps=steps, eps=eps,
                                eps_mode=eps_mode, compute_dtype=compute_dtype, method=method,
                                schedule=schedule, safety_factor=safety_factor)


    def qk_clip(weights, max_logits, *, num_heads, head_dim, num_kv_heads=None, threshold=100.0,
                alpha=0.5, rows="grouped", row_begin=0, group=None):
        """QK-clip (MuonClip, Kimi K2) after an optimizer step, in place.

        weights: a tensor or a list of tensors holding query and/or key rows
        (dim 0): this process's rows [row_begin, row_begin + rows) of each global
        weight; rows: 'query' (H·d rows), 'key' (G·d rows), 'grouped' (fused QKV
        per query group [q heads; k; v], Megatron-Core's layout; with G = H per
        head [q_h; k_h; v_h]) or 'blocked' (fused [Q; K; V]), one for all
        weights or a list; row_begin likewise. max_logits: the step's largest
        pre-softmax logit q·k/√d of each of the num_heads query heads. With
        ``group`` (a torch.distributed process group, or
        ``torch.distributed.group.WORLD``), the maxima are first all-reduced with
        MAX over it (the ranks that saw different data). Per query group of
        num_heads / num_kv_heads heads: gamma = threshold / its largest maximum
        when that exceeds the threshold, else 1; its q rows are scaled by
        gamma**alpha and its k rows by gamma**(1 - alpha), each rounded once to
        the weight's dtype; rows of heads not clipped are untouched. Every
        argument is checked before a weight changes (ValueError naming it).
        Returns gamma per query head (float64).
        """
        where = "qk_clip"
        num_heads, head_dim, num_kv_heads, threshold, alpha = _qk_clip_args(
            where, num_heads, head_dim, num_kv_heads, threshold, alpha)
        if isinstance(weights, torch.Tensor):
            weights = [weights]
        weights = list(weights)
        rows = [rows] * len(weights) if isinstance(rows, str) else list(rows)
        row_begins = [row_begin] * len(weights) if not isinstance(row_begin, (list, tuple)) \
            else list(row_begin)
        row_begins = [_checks.number(where, "row_begin" if not isinstance(row_begin, (list, tuple))
                                     else f"row_begin[{i}]", r, integer=True)
                      for i, r in enumerate(row_begins)]
        max_logits = torch.as_tensor(max_logits).detach().to(torch.float64).clone()
        if group is not None:
            import torch.distributed as dist
            dist.all_reduce(max_logits, op=dist.ReduceOp.MAX, group=group)
        return _C.qk_clip_(weights, rows, row_begins, max_logits, num_heads=num_heads,
                           head_dim=head_dim, num_kv_heads=num_kv_heads, threshold=threshold,
                           alpha=alpha)


    def qk_clip_gamma(max_logits, num_heads, head_dim, num_kv_heads=0, threshold=100.0,
                      alpha=0.5):
        """gamma per query head (float64): per query group, threshold over its
        largest maximum when that exceeds the threshold, else 1 (as qk_clip
        computes it, changing nothing). Bad arguments raise ValueError naming
        them."""
        args = _qk_clip_args("qk_clip_gamma", num_heads, head_dim, num_kv_heads, threshold, alpha)
        return _C.qk_clip_gamma(torch.as_tensor(max_logits), *args)


    def _qk_clip_args(where, num_heads, head_dim, num_kv_heads, threshold, alpha):
        """The numbers of qk_clip and qk_clip_gamma, checked for type (ValueError
        naming the argument); num_kv_heads None is 0 (as many as num_heads)."""
        return (_checks.number(where, "num_heads", num_heads, integer=True),
                _checks.number(where, "head_dim", head_dim, integer=True),
                0 if num_kv_heads is None else
                _checks.number(where, "num_kv_heads", num_kv_heads, integer=True),
                _checks.number(where, "threshold", threshold),
                _checks.number(where, "alpha", alpha))
