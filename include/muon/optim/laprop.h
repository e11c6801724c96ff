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

#include <cstdint>
#include <vector>

#include "muon/optim/settings_digest.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"

namespace muon {

/// Options of `muon::LaProp` (per parameter group), as chained setters.
/// Defaults are Emerging-Optimizers': lr 1e-3, β1 0.9, β2 0.999, ε 1e-8,
/// no weight decay, bias correction on.
struct LaPropOptions : public torch::optim::OptimizerCloneableOptions<LaPropOptions>,
                       public DigestibleOptions {
  /// Options with learning rate `lr` and every other field at its default.
  LaPropOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): torch pattern

  /// Learning rate, >= 0.
  TORCH_ARG(double, lr) = 1e-3;
  /// Decay of the momentum of normalized gradients, in [0, 1).
  TORCH_ARG(double, beta1) = 0.9;
  /// Decay of the second moment, in [0, 1).
  TORCH_ARG(double, beta2) = 0.999;
  /// Added to √v̂ in the denominator, >= 0 (at 0, an element whose gradients
  /// have all been 0 divides 0 by 0, as in Emerging-Optimizers).
  TORCH_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay, >= 0: p ← p·(1 − lr·wd).
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Divide v by 1 − β2^t and m by 1 − β1^t (Adam's bias correction).
  TORCH_ARG(bool, correct_bias) = true;

 public:
  /// Checks every field; raises c10::ValueError "[muon::LaProp] <arg> must be ..., got <value>".
  void validate() const;
  /// Reads every field written by the other overload.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes every field.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Mixes every field that changes a step (lr aside) into `digest`.
  void mix_settings(SettingsDigest& digest) const override;
  /// Field-wise equality.
  friend bool operator==(const LaPropOptions& lhs, const LaPropOptions& rhs);
  ~LaPropOptions() override = default;
  /// `lr()`, for LR schedulers.
  double get_lr() const override;
  /// `lr(lr)`, for LR schedulers.
  void set_lr(double lr) override;
};

/// Per-parameter state of `muon::LaProp`.
struct LaPropParamState : public torch::optim::OptimizerCloneableParamState<LaPropParamState> {
  /// Steps taken on this parameter (t of the bias correction).
  TORCH_ARG(int64_t, step) = 0;
  /// Momentum m of the normalized gradients: the parameter's shape, dtype
  /// and device; zeros at first use.
  TORCH_ARG(at::Tensor, exp_avg);
  /// Second moment v: like `exp_avg`.
  TORCH_ARG(at::Tensor, exp_avg_sq);

 public:
  /// Reads `step`, `exp_avg` and `exp_avg_sq`.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes `step`, `exp_avg` and `exp_avg_sq`.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Equal step and bit-equal buffers.
  friend bool operator==(const LaPropParamState& lhs, const LaPropParamState& rhs);
  ~LaPropParamState() override = default;
};

/// The LaProp optimizer: a `torch::optim::Optimizer` for parameters of any shape.
///
///     muon::LaProp opt(model->parameters(), muon::LaPropOptions(1e-3).weight_decay(0.1));
///
/// Per-group options, `get_lr`/`set_lr` for LR schedulers, and `save`/`load`
/// in LibTorch's own optimizer archive layout (state matched to parameters
/// by position), with the options beside it.
class LaProp : public torch::optim::Optimizer, public StateBytes, public StepGuard {
 public:
  /// LaProp over `param_groups`; groups without options get `defaults`.
  explicit LaProp(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                  LaPropOptions defaults = {});
  /// LaProp over one group of `params`.
  explicit LaProp(std::vector<at::Tensor> params, LaPropOptions defaults = {});

  /// One step on every parameter with a gradient; `closure`, if given, runs
  /// first with grad mode enabled and its loss is returned. The checks of
  /// muon/optim/step_guard.h run first (options of every group, gradients,
  /// the non-finite policy).
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Validates every group's options and parameters; raises c10::ValueError.
  void check_before_step() override;
  /// Writes options and state.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores options and state written by `save` into a LaProp with the
  /// same group structure (raises otherwise, changing nothing).
  void load(torch::serialize::InputArchive& archive) override;

  /// Bytes held in the two moment buffers.
  int64_t state_bytes() const override;
};

}  // namespace muon
