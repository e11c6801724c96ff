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

from . import _C
from ._C import (  # noqa: F401
    coefficient_set_aliases,
    coefficient_set_info,
    coefficient_set_names,
    coefficients,
    load_plugin,
    newton_schulz_cpu_kernels,
    newton_schulz_flops,
    optimizer_names,
    scale_factor,
    scale_mode_names,
    state_schema,
)
from .optim import (  # noqa: F401
    AdaptiveMuon,
    Dion2,
    LaProp,
    Lion,
    MOP,
    Muon,
    MuonHyperball,
    MuonWithAdamW,
    NorDion2,
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
from . import distributed  # noqa: F401

__version__ = "0.1.0"


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
