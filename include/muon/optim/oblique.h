#pragma once

/// Riemannian SGD and Adam on the oblique manifold (tensors whose slices
/// along `dim` have unit L2 norm; for a matrix with dim 0, unit-norm columns),
/// with the arithmetic and defaults of NVIDIA-NeMo/Emerging-Optimizers'
/// ObliqueSGD and ObliqueAdam (registered as "oblique_sgd" and
/// "oblique_adam" in emerging_optimizers/riemannian_optimizers/
/// normalized_optimizer.py at commit fd77292, weight decay by
/// emerging_optimizers/mixin.py's WeightDecayMixin).
///
/// One step t (1-based) on p with gradient g, ⟨a, b⟩ the sum of a⊙b along
/// `dim` (kept as a size-1 dimension):
///
///   oblique_sgd    u ← g + μ·u                     (theory-style momentum)
///   oblique_adam   m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²
///                  u = (m / c1) / (√v / c2 + eps), c_i = 1 − β_i^t with
///                  `correct_bias` (else 1)
///   r = u − p·⟨p, u⟩                               (tangent projection)
///   weight decay   decoupled: p ← p − lr·wd·p; independent: p ← p − wd·p;
///                  l2: r ← r + wd·p
///   p ← p − lr·r
///   p ← p / max(‖p‖_dim, eps)                      (retraction)
///
/// ObliqueAdam divides √v by c2 itself, not by √c2 as Adam does:
/// Emerging-Optimizers' arithmetic, kept so that results match it.
/// Emerging-Optimizers accepts 2-D parameters only; these accept any
/// parameter with at least one dimension, `dim` in [−ndim, ndim).
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

/// Options of `muon::ObliqueSGD` (per parameter group), as chained setters.
/// Defaults are Emerging-Optimizers': lr 1e-3, momentum 0.9, no weight decay
/// (method "decoupled"), dim 0, eps 1e-8.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::ObliqueSGD] <arg> must be ..., got
/// <value>".
MUON_DEFINE_OPTIONS(ObliqueSGDOptions, 1e-3,
                    /// Momentum μ, in [0, 1): u ← g + μ·u.
                    (double, momentum, 0.9, rule::decay("momentum μ (u ← g + μ·u)")),
                    /// Weight decay, >= 0, applied as `weight_decay_method` says.
                    (double, weight_decay, 0.0, rule::non_negative("weight decay")),
                    /// "decoupled" (p ← p − lr·wd·p), "independent" (p ← p − wd·p) or "l2"
                    /// (wd·p added to the projected gradient), Emerging-Optimizers' methods.
                    (std::string, weight_decay_method, "decoupled", rule::weight_decay_method()),
                    /// The dimension the norms are taken along; in [−ndim, ndim) of every parameter.
                    (int64_t, dim, 0, rule::any("the dimension the norms are taken along")),
                    /// Lower bound of the norm the retraction divides by, > 0.
                    (double, eps, 1e-8, rule::positive("lower bound of the retraction's norm")));

/// Per-parameter state of `muon::ObliqueSGD`: `step` and the momentum buffer.
MUON_DEFINE_STATE(ObliqueSGDParamState,
                  /// Momentum u: the parameter's shape, dtype and device; zeros at first use.
                  momentum_buffer);

/// Riemannian SGD with momentum on the oblique manifold: a
/// `torch::optim::Optimizer` for parameters with at least one dimension.
///
///     muon::ObliqueSGD opt(model->parameters(), muon::ObliqueSGDOptions(1e-2).dim(1));
///
/// Per-group options, `get_lr`/`set_lr`, `save`/`load` and `state_bytes`
/// are muon::ElementwiseOptimizer's (muon/optim/elementwise.h). A step
/// raises c10::ValueError, changing nothing, where `dim` is out of a
/// parameter's range.
class ObliqueSGD : public ElementwiseOptimizer<ObliqueSGD, ObliqueSGDOptions, ObliqueSGDParamState> {
 public:
  /// ObliqueSGD over `param_groups` or over one group of parameters.
  using ElementwiseOptimizer::ElementwiseOptimizer;

  /// Messages say "[muon::ObliqueSGD] ..."; archive keys "oblique_sgd_groups", ...
  static constexpr OptimizerNames kNames{"muon::ObliqueSGD", "oblique_sgd"};
  /// The options' checks, then `dim` against every parameter's ndim.
  void check_before_step() override;
  /// One step on `param` (the header's formula).
  static void update(at::Tensor& param, const at::Tensor& grad, ObliqueSGDParamState& state,
                     const ObliqueSGDOptions& options);
};

/// Options of `muon::ObliqueAdam` (per parameter group), as chained setters.
/// Defaults are Emerging-Optimizers': lr 1e-3, betas (0.9, 0.99), no weight
/// decay (method "decoupled"), dim 0, eps 1e-8, bias correction on.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::ObliqueAdam] <arg> must be ..., got
/// <value>".
MUON_DEFINE_OPTIONS(ObliqueAdamOptions, 1e-3,
                    /// First-moment decay β1, in [0, 1).
                    (double, beta1, 0.9, rule::decay("first-moment decay")),
                    /// Second-moment decay β2, in [0, 1).
                    (double, beta2, 0.99, rule::decay("second-moment decay")),
                    /// Weight decay, >= 0, applied as `weight_decay_method` says.
                    (double, weight_decay, 0.0, rule::non_negative("weight decay")),
                    /// "decoupled", "independent" or "l2", as ObliqueSGDOptions'.
                    (std::string, weight_decay_method, "decoupled", rule::weight_decay_method()),
                    /// The dimension the norms are taken along; in [−ndim, ndim) of every parameter.
                    (int64_t, dim, 0, rule::any("the dimension the norms are taken along")),
                    /// Added to √v / c2, and the lower bound of the retraction's norm; > 0.
                    (double, eps, 1e-8, rule::positive("added to √v / c2; lower bound of the retraction's norm")),
                    /// c_i = 1 − β_i^t (else 1).
                    (bool, correct_bias, true, rule::any("bias correction of both moments")));

/// Per-parameter state of `muon::ObliqueAdam`: `step` (t) and both moments.
MUON_DEFINE_STATE(ObliqueAdamParamState,
                  /// First moment m; zeros at first use.
                  exp_avg,
                  /// Second moment v; zeros at first use.
                  exp_avg_sq);

/// Riemannian Adam on the oblique manifold: a `torch::optim::Optimizer` for
/// parameters with at least one dimension; as muon::ObliqueSGD otherwise.
class ObliqueAdam
    : public ElementwiseOptimizer<ObliqueAdam, ObliqueAdamOptions, ObliqueAdamParamState> {
 public:
  /// ObliqueAdam over `param_groups` or over one group of parameters.
  using ElementwiseOptimizer::ElementwiseOptimizer;

  /// Messages say "[muon::ObliqueAdam] ..."; archive keys "oblique_adam_groups", ...
  static constexpr OptimizerNames kNames{"muon::ObliqueAdam", "oblique_adam"};
  /// The options' checks, then `dim` against every parameter's ndim.
  void check_before_step() override;
  /// One step on `param` (the header's formula).
  static void update(at::Tensor& param, const at::Tensor& grad, ObliqueAdamParamState& state,
                     const ObliqueAdamOptions& options);
};

}  // namespace muon
