#pragma once

/// The LaProp optimizer on `torch::optim` (Ziyin, Wang and Ueda 2020,
/// "LaProp: Separating Momentum and Adaptivity in Adam", arXiv:2002.04839),
/// with the arithmetic and defaults of NVIDIA-NeMo/Emerging-Optimizers'
/// LaProp (emerging_optimizers/scalar_optimizers/laprop.py and its
/// calculate_laprop_update).
///
/// LaProp keeps Adam's two moments but normalizes the gradient by the second
/// moment before it enters the momentum (RMSProp with momentum, or
/// normalized SGD with momentum). One step t (1-based), with decoupled
/// weight decay:
///
///   p ← p·(1 − lr·wd)
///   v ← β2·v + (1 − β2)·g²
///   v̂ = v / (1 − β2^t)
///   m ← β1·m + (1 − β1)·g / (√v̂ + ε)
///   p ← p − lr·m / (1 − β1^t)
///
/// Without `correct_bias` both divisors 1 − β^t are 1. The momentum holds
/// normalized gradients, so β1 and the lr can change during a run without
/// rescaling what it has accumulated.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <tuple>
#include <vector>

#include "muon/optim/elementwise.h"
#include "muon/optim/settings_digest.h"

namespace muon {

/// Options of `muon::LaProp` (per parameter group), as chained setters.
/// Defaults are Emerging-Optimizers': lr 1e-3, β1 0.9, β2 0.999, ε 1e-8,
/// no weight decay, bias correction on.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::LaProp] <arg> must be ..., got <value>".
MUON_DEFINE_OPTIONS(LaPropOptions, 1e-3,
                    /// Decay of the momentum of normalized gradients, in [0, 1).
                    (double, beta1, 0.9, rule::decay("decay of the momentum of normalized gradients")),
                    /// Decay of the second moment, in [0, 1).
                    (double, beta2, 0.999, rule::decay("second-moment decay")),
                    /// Added to √v̂ in the denominator, > 0 (at 0, an element whose gradients
                    /// have all been 0 would divide 0 by 0).
                    (double, eps, 1e-8, rule::denominator_eps("added to the square root of the second moment")),
                    /// Decoupled weight decay, >= 0: p ← p·(1 − lr·wd).
                    (double, weight_decay, 0.0, rule::non_negative("decoupled weight decay")),
                    /// Divide v by 1 − β2^t and m by 1 − β1^t (Adam's bias correction).
                    (bool, correct_bias, true, rule::any("Adam-style bias correction of both moments")));

/// Per-parameter state of `muon::LaProp`: `step` (steps taken on this
/// parameter, t of the bias correction) and the two moments.
MUON_DEFINE_STATE(LaPropParamState,
                  /// Momentum m of the normalized gradients: the parameter's shape, dtype
                  /// and device; zeros at first use.
                  exp_avg,
                  /// Second moment v: like `exp_avg`.
                  exp_avg_sq);

/// The LaProp optimizer: a `torch::optim::Optimizer` for parameters of any shape.
///
///     muon::LaProp opt(model->parameters(), muon::LaPropOptions(1e-3).weight_decay(0.1));
///
/// Per-group options, `get_lr`/`set_lr` for LR schedulers, and `save`/`load`
/// in LibTorch's own optimizer archive layout (state matched to parameters
/// by position), with the options beside it; `state_bytes` counts
/// the two moment buffers. Constructors, step, checks and save/load are
/// muon::ElementwiseOptimizer's (muon/optim/elementwise.h).
MUON_DEFINE_ELEMENTWISE(LaProp, "laprop");

}  // namespace muon
