#pragma once

/// Simplified AdEMAMix on `torch::optim` (Morwani, Vyas, Kakade et al.
/// 2025, "Connections between Schedule-Free Optimizers, AdEMAMix, and
/// Accelerated SGD Variants", arXiv:2502.02431; AdEMAMix itself is Pagliardini,
/// Ablin and Grangier 2024, arXiv:2409.03137), with the arithmetic and
/// defaults of NVIDIA-NeMo/Emerging-Optimizers' SimplifiedAdEMAMix (class
/// registered as "sim_ademamix" in emerging_optimizers/scalar_optimizers/
/// __init__.py at commit 2472b2eac466a562c20bf4366b2bb7866916c563, stepping
/// through scalar_optimizers/base.py's TwoMomentsOptimizer and
/// calculate_sim_ademamix_update in scalar_optimizers/update_functions/
/// ademamix.py at commit ab596e0c89dd69bf46f9a773ae8f1e98c68e2af1; the β
/// warmup schedule as in scalar_optimizers/ademamix.py at commit
/// f424e8c7af1c29ff4a30baffeb5c4a9c0612b9f6).
///
/// One momentum accumulated "theory style" (no 1 − β factor on the
/// gradient) and Adam's second moment; the current gradient enters the
/// update again with weight α. One step t (1-based):
///
///   weight decay   decoupled: p ← p − lr·wd·p; independent: p ← p − wd·p;
///                  l2: g ← g + wd·p
///   β = β1, or during a warmup of N steps (t < N) the half-life
///   interpolation h⁻¹((1 − t/N)·h(β_min) + (t/N)·h(β1)) with
///   h(b) = ln ½ / ln(b + 1e-8) − 1, h⁻¹(s) = ½^(1/(s + 1))
///   m ← β·m + g
///   v ← β2·v + (1 − β2)·g²
///   m̂ = m·(1 − β) / (1 − β^t);  v̂ = v / (1 − β2^t)   (both 1 without correct_bias)
///   p ← p − lr·(α·g + m̂) / (√v̂ + ε)
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

/// Options of `muon::SimAdEMAMix` (per parameter group), as chained setters.
/// Defaults are Emerging-Optimizers': lr 1e-3, β1 0.9999, β2 0.999, ε 1e-8,
/// no weight decay (method "decoupled"), bias correction on, no β warmup
/// (min_beta_fast 0.9 when one is set), α 2.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::SimAdEMAMix] <arg> must be ...".
MUON_DEFINE_OPTIONS(
    SimAdEMAMixOptions, 1e-3,
    /// Decay β of the momentum (Emerging-Optimizers' β_fast final value), in [0, 1).
    (double, beta1, 0.9999, rule::decay("momentum decay (final value of the warmup)")),
    /// Decay of the second moment, in [0, 1).
    (double, beta2, 0.999, rule::decay("second-moment decay")),
    /// Added to √v̂ in the denominator, > 0 (0 would divide 0 by 0 on a zero gradient element).
    (double, eps, 1e-8, rule::denominator_eps("added to the square root of the second moment")),
    /// Weight decay, >= 0, applied as `weight_decay_method` says.
    (double, weight_decay, 0.0, rule::non_negative("weight decay")),
    /// "decoupled" (p ← p − lr·wd·p), "independent" (p ← p − wd·p) or "l2"
    /// (wd·p added to the gradient the step uses; `p.grad` itself is left
    /// unchanged), Emerging-Optimizers' WeightDecayMixin methods.
    (std::string, weight_decay_method, "decoupled", rule::weight_decay_method()),
    /// Divide m by (1 − β^t)/(1 − β) and v by 1 − β2^t.
    (bool, correct_bias, true, rule::any("bias correction of both moments")),
    /// Steps N over which β rises from `min_beta_fast` to `beta1` (half-life
    /// linear warmup), >= 0; 0 disables the warmup (Emerging-Optimizers' None).
    (int64_t, num_beta_fast_warmup_steps, 0,
     rule::non_negative("steps of the half-life warmup of beta1 from min_beta_fast (0: none)").because("0: no warmup")),
    /// β at the start of the warmup, in [0, 1).
    (double, min_beta_fast, 0.9, rule::decay("momentum decay at the start of the warmup")),
    /// Weight α of the current gradient in the update, finite.
    (double, alpha, 2.0, rule::finite("weight of the current gradient in the update")));

/// β of step `step` (1-based) under `options`' warmup: `beta1` when
/// num_beta_fast_warmup_steps is 0 or step >= it, else the half-life
/// interpolation of the header's formula (Emerging-Optimizers'
/// _linear_half_life_warmup_scheduler).
double sim_ademamix_beta(const SimAdEMAMixOptions& options, int64_t step);

/// Per-parameter state of `muon::SimAdEMAMix`: `step` (steps taken on this
/// parameter, t of the bias correction and the warmup) and the two moments.
MUON_DEFINE_STATE(SimAdEMAMixParamState,
                  /// Momentum m (a sum of β-discounted gradients): the parameter's shape,
                  /// dtype and device; zeros at first use.
                  exp_avg,
                  /// Second moment v: like `exp_avg`.
                  exp_avg_sq);

/// Simplified AdEMAMix: a `torch::optim::Optimizer` for parameters of any shape.
///
///     muon::SimAdEMAMix opt(model->parameters(), muon::SimAdEMAMixOptions(1e-4).alpha(1.0));
///
/// Per-group options, `get_lr`/`set_lr` for LR schedulers, and `save`/`load`
/// in LibTorch's own optimizer archive layout (state matched to parameters
/// by position), with the options beside it; `state_bytes` counts
/// the two moment buffers. Constructors, step, checks and save/load are
/// muon::ElementwiseOptimizer's (muon/optim/elementwise.h).
MUON_DEFINE_ELEMENTWISE(SimAdEMAMix, "sim_ademamix");

}  // namespace muon
