#pragma once

/// The Signum optimizer on `torch::optim` (Bernstein, Wang, Azizzadenesheli
/// and Anandkumar 2018, "signSGD: Compressed Optimisation for Non-Convex
/// Problems", arXiv:1802.04434): the sign of a momentum, with the arithmetic
/// and defaults of NVIDIA-NeMo/Emerging-Optimizers' Signum (class `Signum`
/// registered as "signum" in emerging_optimizers/scalar_optimizers/__init__.py
/// at commit 2472b2eac466a562c20bf4366b2bb7866916c563, stepping through
/// scalar_optimizers/base.py's SingleMomentumOptimizer and
/// calculate_signum_update in scalar_optimizers/update_functions/signum.py at
/// commit b309e2f01cda75dc96a6dc1a2355a7b3b64b5e16).
///
/// One step t (1-based), β the momentum, c(t) = 1 − β^t with `correct_bias`
/// (else 1):
///
///   weight decay   decoupled: p ← p − lr·wd·p; independent: p ← p − wd·p;
///                  l2: g ← g + wd·p
///   m ← β·m + (1 − β)·g
///   u = m / c(t)                                  (nesterov off)
///   u = β·m / c(t + 1) + (1 − β)·g / c(t)         (nesterov on)
///   p ← p − lr·sign(u)
///
/// Every coordinate moves by lr (or 0), so the lr sits on Lion's scale
/// rather than AdamW's. With β = 0 it is signSGD.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "muon/optim/elementwise.h"
#include "muon/optim/settings_digest.h"

namespace muon {

/// Options of `muon::Signum` (per parameter group), as chained setters.
/// Defaults are Emerging-Optimizers': lr 1e-3, momentum 0.9, no weight
/// decay (method "decoupled"), bias correction on, nesterov off.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::Signum] <arg> must be ..., got <value>".
MUON_DEFINE_OPTIONS(SignumOptions, 1e-3,
                    /// Momentum decay β, in [0, 1) (0: signSGD).
                    (double, momentum, 0.9, rule::decay("momentum decay β (0: signSGD)")),
                    /// Weight decay, >= 0, applied as `weight_decay_method` says.
                    (double, weight_decay, 0.0, rule::non_negative("weight decay")),
                    /// "decoupled" (p ← p − lr·wd·p), "independent" (p ← p − wd·p) or "l2"
                    /// (wd·p added to the gradient the step uses; `p.grad` itself is left
                    /// unchanged), Emerging-Optimizers' WeightDecayMixin methods.
                    (std::string, weight_decay_method, "decoupled", rule::weight_decay_method()),
                    /// Divide the momentum by 1 − β^t (Adam's bias correction; it changes
                    /// only the Nesterov combination, never the sign of m alone).
                    (bool, correct_bias, true, rule::any("Adam-style bias correction of the momentum")),
                    /// Nesterov look-ahead: the sign of β·m/(1 − β^(t+1)) + (1 − β)·g/(1 − β^t).
                    (bool, nesterov, false, rule::any("Nesterov look-ahead update")));

/// Per-parameter state of `muon::Signum`: `step` (steps taken on this
/// parameter, t of the bias correction) and the momentum.
MUON_DEFINE_STATE(SignumParamState,
                  /// Momentum m: the parameter's shape, dtype and device; zeros at first use.
                  exp_avg);

/// The Signum optimizer: a `torch::optim::Optimizer` for parameters of any shape.
///
///     muon::Signum opt(model->parameters(), muon::SignumOptions(1e-3).momentum(0.95));
///
/// Per-group options, `get_lr`/`set_lr` for LR schedulers, and `save`/`load`
/// in LibTorch's own optimizer archive layout (state matched to parameters
/// by position), with the options beside it; `state_bytes` counts
/// the momentum buffers. Constructors, step, checks and save/load are
/// muon::ElementwiseOptimizer's (muon/optim/elementwise.h).
MUON_DEFINE_ELEMENTWISE(Signum, "signum");

}  // namespace muon
