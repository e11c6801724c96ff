#pragma once

/// The Lion optimizer on `torch::optim` (Chen et al. 2023, "Symbolic
/// Discovery of Optimization Algorithms", arXiv:2302.06675).
///
/// Lion keeps one momentum buffer m per parameter and steps by the sign of
/// an interpolation of m and the gradient g. One step, with decoupled weight
/// decay:
///
///   u ← sign(β1·m + (1 − β1)·g)
///   p ← p·(1 − lr·wd) − lr·u
///   m ← β2·m + (1 − β2)·g
///
/// Every coordinate of the update has magnitude lr (or 0), so Lion's lr is
/// typically 3–10× smaller than AdamW's and its weight decay 3–10× larger
/// (the paper's advice). Here it serves mostly as the scalar optimizer beside
/// Muon (`scalar_optimizer = lion` in muon::OptimizerConfig).
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

/// Options of `muon::Lion` (per parameter group), as chained setters.
/// Defaults are the paper's: lr 1e-4, β1 0.9, β2 0.99, no weight decay.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::Lion] <arg> must be ..., got <value>".
MUON_DEFINE_OPTIONS(LionOptions, 1e-4,
                    /// Interpolation weight of the momentum in the update direction, in [0, 1).
                    (double, beta1, 0.9, rule::decay("interpolation weight of the momentum in the update")),
                    /// Decay of the momentum buffer, in [0, 1).
                    (double, beta2, 0.99, rule::decay("momentum decay")),
                    /// Decoupled weight decay, >= 0: p ← p·(1 − lr·wd).
                    (double, weight_decay, 0.0, rule::non_negative("decoupled weight decay")));

/// Per-parameter state of `muon::Lion`: `step` (steps taken on this
/// parameter) and the momentum.
MUON_DEFINE_STATE(LionParamState,
                  /// Momentum m: the parameter's shape, dtype and device; zeros at first use.
                  exp_avg);

/// The Lion optimizer: a `torch::optim::Optimizer` for parameters of any shape.
///
///     muon::Lion opt(model->parameters(), muon::LionOptions(1e-4).weight_decay(0.1));
///
/// Per-group options, `get_lr`/`set_lr` for LR schedulers, and `save`/`load`
/// in LibTorch's own optimizer archive layout (state matched to parameters
/// by position), with the options beside it; `state_bytes` counts the
/// momentum buffers. Constructors, step, checks and save/load are
/// muon::ElementwiseOptimizer's (muon/optim/elementwise.h).
MUON_DEFINE_ELEMENTWISE(Lion, "lion");

}  // namespace muon
