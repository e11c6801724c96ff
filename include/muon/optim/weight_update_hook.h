#pragma once

/// Weight-update hooks: what Emerging-Optimizers' hooks
/// (emerging_optimizers/weight_update_hooks/{hyperball,radial_brake,
/// relative_update}.py at fd77292, called around the weight update of
/// orthogonalized_optimizers/orthogonalized_optimizer.py) do, as an option
/// of every optimizer of the registry that steps by p ← c·p − lr·U: the
/// weight p decayed by a factor c (its weight decay), then its update U
/// added at the learning rate. Config fields `weight_update_hook` and
/// `weight_update_hook_*` (docs/config.md), per parameter group.
///
/// With p_wd = c·p (the weight after the step's weight decay):
///
///   hyperball        U ← R·U/‖U‖ (0 when ‖U‖ < eps), p ← p_wd − lr·U, then
///                    p ← R·p/‖p‖ (0 when ‖p‖ < eps): the weight stays on the
///                    sphere of radius R and moves by lr·R a step.
///   relative_update  U ← ‖p_wd‖/‖U‖·U (0 when either norm < eps), p ← p_wd − lr·U:
///                    the lr is the relative size of the step.
///   radial_brake     p ← p_wd − lr·U, then p rescaled so that its norm moves
///                    from ‖p_wd‖ by outward_scale of the change when it
///                    grew (by ≥ eps) and by inward_scale when it shrank.
///
/// Norms are Frobenius norms of the whole parameter (a conv weight's, a
/// stack of experts' as one tensor, as Emerging-Optimizers takes them). The
/// hooks read the step from the weight before and after it: U = (p_wd −
/// p_after)/lr, so they wear any optimizer whose step has that form, the
/// library's and LibTorch's alike, and each optimizer says how it decays
/// (OptimizerEntry::hook_weight_decay). An optimizer that changes the weight
/// otherwise (a projection after the update, factors rebuilt) refuses them.
/// The lr and the weight decay coefficient are read from each group's
/// options at every step, so schedules and later edits reach the hooks.
/// The arithmetic runs in double for float, bfloat16 and half weights (once
/// rounded back), so it adds one rounding of p to the optimizer's own.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "muon/enum_names.h"

namespace muon {

/// Which hook a param group wears.
enum class WeightUpdateHookKind { kNone, kHyperball, kRadialBrake, kRelativeUpdate };

/// "none" | "hyperball" | "radial_brake" | "relative_update".
MUON_ENUM_NAMES(WeightUpdateHookKind, parse_weight_update_hook);
/// The hooks' names, in declaration order.
std::vector<std::string> weight_update_hook_names();

/// A hook and its parameters (Emerging-Optimizers' names and defaults).
struct WeightUpdateHookOptions {
  /// The hook.
  TORCH_ARG(WeightUpdateHookKind, kind) = WeightUpdateHookKind::kNone;
  /// hyperball: the radius R, finite and >= eps.
  TORCH_ARG(double, radius) = 1.0;
  /// radial_brake: the fraction of an outward change of the norm kept, in [0, 1].
  TORCH_ARG(double, outward_scale) = 0.5;
  /// radial_brake: the fraction of an inward change of the norm kept, in [0, 1].
  TORCH_ARG(double, inward_scale) = 1.0;
  /// Norms below eps count as zero; finite and > 0.
  TORCH_ARG(double, eps) = 1e-15;

 public:
  /// Checks every field; raises c10::ValueError "[muon::WeightUpdateHook] <field> must be ..., got <value>".
  void validate() const;
};

/// How a step decays the weight before it adds its update: the factor c of
/// p ← c·p − lr·U.
enum class HookedWeightDecay {
  kDecoupled,    ///< c = 1 − lr·wd
  kIndependent,  ///< c = 1 − wd
  kL2,           ///< c = 1 (wd·p is in the gradient, so in U)
  kPalm,         ///< c = 1 − lr²·wd
};

/// "decoupled" | "independent" | "l2" | "palm" → the decay; another name
/// (e.g. "spectral_clipped", not a factor) raises c10::ValueError naming `field`.
HookedWeightDecay parse_hooked_weight_decay(const std::string& name, const std::string& field);
/// The decay `name` names, or nullopt where it is not a factor c.
std::optional<HookedWeightDecay> try_parse_hooked_weight_decay(const std::string& name);
/// Why `name`, the value of `field`, is not a decay the hooks take: the
/// message of parse_hooked_weight_decay's error, without its "[...] " prefix.
std::string hooked_weight_decay_refusal(const std::string& name, const std::string& field);

/// Sums, for each parameter i of `params`, row i of `sums` (a (n, k) double
/// tensor of partial sums over this process's part of parameter i) over the
/// processes that hold its other parts: what a layout that splits matrices
/// supplies. Absent: every parameter is whole in this process.
using SumAcrossParts = std::function<void(const std::vector<at::Tensor>& params, at::Tensor& sums)>;

/// The hooks of one optimizer's param groups, run by `CompositeOptimizer`
/// around that optimizer's step.
class WeightUpdateHooks {
 public:
  /// A hooked group: its hook, how its optimizer decays the weight, and the
  /// weight decay coefficient. The lr, and the coefficient where
  /// `weight_decay_of` reads it, come from the group's options at each step.
  struct Group {
    WeightUpdateHookOptions hook;
    /// nullopt: the optimizer's decay is not a factor c (say, a clipped
    /// one), which the hooks take only while the coefficient is 0;
    /// `decay_refusal` names it in the error.
    std::optional<HookedWeightDecay> decay = HookedWeightDecay::kDecoupled;
    std::string decay_refusal;
    /// The coefficient when `weight_decay_of` is empty.
    double weight_decay = 0.0;
    /// Reads the coefficient from the group's options (OptimizerEntry::hook_weight_decay_of).
    std::function<double(const torch::optim::OptimizerOptions&)> weight_decay_of;
  };

  /// `groups[g]` is param group g's hook (nullopt: none).
  explicit WeightUpdateHooks(std::vector<std::optional<Group>> groups, SumAcrossParts sum = {});

  /// Whether any group wears a hook.
  bool any() const;
  /// Raises c10::ValueError where a hooked group's weight decay, as its
  /// options in `optimizer` say now, is not 0 and not a factor c; changes nothing.
  void check(torch::optim::Optimizer& optimizer) const;
  /// Before `optimizer` steps: keeps the weights of the hooked parameters
  /// that have a gradient and the learning rates their groups step with.
  void before_step(torch::optim::Optimizer& optimizer);
  /// After it stepped: applies each hook to what the step did (see the top
  /// of this header) and forgets the weights kept.
  void after_step(torch::optim::Optimizer& optimizer);

 private:
  struct Kept {
    at::Tensor param;   // the live parameter
    at::Tensor before;  // its weight before the step
    const Group* group;
    double lr;
    double weight_decay;
  };
  double weight_decay_of(size_t group, const torch::optim::OptimizerOptions& options) const;
  std::pair<at::Tensor, at::Tensor> decayed_and_step(size_t i) const;
  at::Tensor square_sums() const;
  void project_to_radius(const std::vector<size_t>& which) const;

  std::vector<std::optional<Group>> groups_;
  SumAcrossParts sum_;
  std::vector<Kept> kept_;
};

}  // namespace muon
