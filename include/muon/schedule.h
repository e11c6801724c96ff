#pragma once

/// Learning-rate schedule for training programs: linear warmup, then cosine
/// or linear decay to a minimum, then constant (Megatron-Core's
/// OptimizerParamScheduler shape), over any `torch::optim::Optimizer`.
///
/// The schedule is defined for the main learning rate `lr` (the peak):
///
///   s < W:         lr(s) = warmup_init + (lr − warmup_init) · s / W
///   W ≤ s < D:     r = (s − W) / (D − W)
///                  linear: lr(s) = lr − (lr − min_lr) · r
///                  cosine: lr(s) = min_lr + (lr − min_lr) · (1 + cos(π·r)) / 2
///   s ≥ D:         lr(s) = min_lr
///   constant style: lr(s) = lr for every s ≥ W
///
/// with W = warmup_steps and D = decay_steps (counted from step 0, warmup
/// included). Every param group follows the same curve scaled to its own
/// base lr (its lr when the schedule was created): group g gets
/// base_g · lr(s) / lr, so a group at half the main lr warms up to half of
/// it and decays to half of min_lr.
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/enum_names.h"

namespace muon {

/// The decay after warmup.
enum class DecayStyle { kConstant, kLinear, kCosine };

/// "constant" | "linear" | "cosine".
MUON_ENUM_NAMES(DecayStyle, parse_decay_style);

/// Options of `WarmupDecaySchedule`, as chained setters.
struct LrScheduleOptions {
  /// Peak (main) learning rate, > 0.
  TORCH_ARG(double, lr) = 1e-3;
  /// Learning rate at the end of the decay, in [0, lr].
  TORCH_ARG(double, min_lr) = 0.0;
  /// Warmup steps W >= 0 (0: no warmup).
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Learning rate at step 0 of the warmup, in [0, lr].
  TORCH_ARG(double, warmup_init) = 0.0;
  /// Step D where the decay ends (> W unless the style is constant).
  TORCH_ARG(int64_t, decay_steps) = 0;
  /// Decay style.
  TORCH_ARG(DecayStyle, style) = DecayStyle::kConstant;

 public:
  /// style by name: "constant" | "linear" | "cosine".
  LrScheduleOptions& style(const std::string& name);
  /// Raises c10::ValueError "[muon::WarmupDecaySchedule] <arg> must be ..., got <value>".
  void validate() const;
};

/// The main learning rate at step `step` (>= 0) under `options`.
double lr_at(const LrScheduleOptions& options, int64_t step);

/// Drives every param group of an optimizer along the schedule.
///
///     muon::WarmupDecaySchedule sched(opt, muon::LrScheduleOptions().lr(3e-4)
///         .warmup_steps(100).decay_steps(1000).style("cosine").min_lr(3e-5));
///     for (...) { ...; opt.step(); sched.step(); }
///
/// The constructor records each group's base lr and sets the step-0 lr;
/// `step()` advances one step and sets every group's lr.
class WarmupDecaySchedule {
 public:
  /// Schedule over `optimizer` (which must outlive it); validates `options`.
  WarmupDecaySchedule(torch::optim::Optimizer& optimizer, LrScheduleOptions options);

  /// Advances one step and sets every group's lr for it.
  void step();
  /// Jumps to `step` (e.g. when resuming) and sets every group's lr for it.
  void set_step(int64_t step);
  /// Steps taken.
  int64_t step_count() const { return step_; }
  /// The main lr at `step`.
  double lr_at(int64_t step) const { return muon::lr_at(options_, step); }
  /// The main lr now.
  double current_lr() const { return lr_at(step_); }
  /// Each group's base lr.
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The options.
  const LrScheduleOptions& options() const { return options_; }

 private:
  void apply();

  torch::optim::Optimizer& optimizer_;
  LrScheduleOptions options_;
  std::vector<double> base_lrs_;
  int64_t step_ = 0;
};

}  // namespace muon
