#pragma once

/// What every optimizer of this library checks before a step touches
/// anything, and what it does with a non-finite gradient.
///
/// Before any parameter or state changes, a step checks:
///  - the options of every group (an edit made after construction, e.g. a
///    negative lr, raises before any group is stepped);
///  - every gradient against its parameter: same shape (a broadcastable
///    shape is still an error), dtype and device, dense;
///  - non-finite gradients (NaN, ±Inf), under the optimizer's policy:
///
///    error       (default) raise c10::ValueError naming the parameter;
///                nothing of the step is applied.
///    skip_step   the whole step is skipped (no parameter, buffer or step
///                count changes) and counted in `skipped_steps()`, as a
///                mixed-precision loss scaler does.
///    propagate   no check: NaN and Inf flow into the update and the state,
///                as in torch.optim (for programs that check elsewhere).
///
/// In a distributed layout the outcome is agreed over the layout's processes
/// (one small all-gather per step), so every rank raises, skips or steps
/// together: no rank steps while another skips, and a rank that fails its
/// checks never leaves the others waiting in a collective.
///
/// At construction (and for groups added later), parameters a step cannot
/// update in place are refused: undefined or non-floating tensors, float16 on
/// CPU (LibTorch's CPU kernels for it are incomplete), tensors whose elements
/// overlap in memory (expanded, stride 0), and a tensor listed twice
/// ("some parameters appear in more than one parameter group", as torch.optim).
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "muon/enum_names.h"

namespace muon {

/// What a step does when a gradient holds NaN or ±Inf (see the top of this header).
enum class NonFinitePolicy {
  /// Raise c10::ValueError naming the parameter; nothing is applied.
  kError,
  /// Skip the whole step on every rank and count it.
  kSkipStep,
  /// No check: non-finite values reach the update and the state.
  kPropagate,
};

/// "error" | "skip_step" | "propagate".
MUON_ENUM_NAMES(NonFinitePolicy, parse_nonfinite_policy);
/// The policies' names, in declaration order.
std::vector<std::string> nonfinite_policy_names();

/// Whether the optimizers' steps in this process are whole or nothing
/// (docs/optimizer.md, "A step happens whole or changes nothing"): on by
/// default, each step copies the parameters it steps and their state first
/// and puts them back if it raises. Off, no copy is made (the memory of one
/// copy of the stepped parameters and state is saved), a failed matrix
/// function still raises c10::ValueError naming the parameter, but a step
/// that raises midway may leave parts of it applied. Process-wide; takes
/// effect at the next step.
void set_whole_steps(bool enabled);
/// The setting of set_whole_steps.
bool whole_steps();

/// The checks before a step (see the top of this header): the non-finite
/// policy, the count of skipped steps, and the hooks an optimizer made of
/// others uses to run its parts' checks once, for all of them, before any
/// part steps. Every optimizer of this library derives from it.
class StepGuard {
 public:
  virtual ~StepGuard() = default;

  /// The policy (kError unless set).
  NonFinitePolicy nonfinite() const { return policy_; }
  /// Sets the policy.
  void set_nonfinite(NonFinitePolicy policy) { policy_ = policy; }
  /// Steps skipped under kSkipStep since construction (not saved in archives).
  int64_t skipped_steps() const { return skipped_; }

  /// Validates what `step()` would apply, raising c10::ValueError and
  /// changing nothing: options of every group, parameters, and anything
  /// else of this process a step checks first.
  virtual void check_before_step() = 0;
  /// The largest `code` over the processes this optimizer's steps are agreed
  /// over, and the lowest rank that passed it: collective for distributed
  /// optimizers, {code, 0} for one process.
  virtual std::pair<int64_t, int64_t> max_over_processes(int64_t code);
  /// Marks this optimizer as a part of another (a composite, a layer-wise
  /// owner's optimizer) that runs these checks for it before stepping it:
  /// its own `step()` then skips them.
  void checked_by_owner(bool owned) { checked_by_owner_ = owned; }
  /// See checked_by_owner.
  bool is_checked_by_owner() const { return checked_by_owner_; }
  /// Marks this optimizer as stepped by a muon::distributed::Layout, which agrees
  /// every step over its processes before calling `step()` (gradients
  /// present, these checks, the non-finite policy: one collective for the
  /// whole layout): the step then runs its checks on none of its own, and
  /// no collective to agree on them. Optimizers made of others pass it on.
  virtual void set_agreed_by_layout(bool agreed) { agreed_by_layout_ = agreed; }
  /// See set_agreed_by_layout.
  bool agreed_by_layout() const { return agreed_by_layout_; }

 protected:
  /// Names parameter `index` of group `group` in messages.
  using Describe = std::function<std::string(size_t group, size_t index)>;

  /// The checks of a step (see the top of this header), run before anything
  /// changes: `local_checks` (check_before_step and the like; it raises to
  /// fail), the gradients of `groups`, and the non-finite
  /// policy. The outcome is agreed through `max_over_processes`. Returns true
  /// when the step goes on, false when it is skipped (and counted); raises
  /// c10::ValueError on every process when one of them failed.
  /// When `is_checked_by_owner()` or `agreed_by_layout()`, returns true at once.
  bool admit_step(const std::vector<torch::optim::OptimizerParamGroup>& groups, const char* who,
                  const std::function<void()>& local_checks, const Describe& describe = nullptr);
  /// A step of `optimizer` (the one deriving from this guard): `closure`'s
  /// loss, computed with gradients on; admit_step over its groups with
  /// `local_checks`; then `update` with gradients off, whole or nothing
  /// (a failure restores what it changed) unless `is_checked_by_owner()`,
  /// whose owner's step is the transaction. Returns the loss.
  at::Tensor guarded_step(torch::optim::Optimizer& optimizer,
                          const torch::optim::Optimizer::LossClosure& closure, const char* who,
                          const std::function<void()>& local_checks,
                          const std::function<void()>& update);

 private:
  NonFinitePolicy policy_ = NonFinitePolicy::kError;
  int64_t skipped_ = 0;
  bool checked_by_owner_ = false;
  bool agreed_by_layout_ = false;
};

/// The step guard of `optimizer` when it is one of this library's; nullptr
/// for others (e.g. torch's AdamW).
StepGuard* step_guard(torch::optim::Optimizer& optimizer);

namespace detail {

/// Raises c10::ValueError "<who>..." for options of LibTorch's optimizers
/// (AdamW, Adam, SGD, Adagrad, RMSprop) that their step would apply without
/// a check (e.g. a negative lr set after construction); other types pass.
void check_torch_options(const torch::optim::OptimizerOptions& options, const char* who,
                         size_t group);

/// Whether every element of `t` is finite (no NaN, no ±Inf). One pass over
/// the bits for contiguous CPU tensors; LibTorch's isfinite otherwise.
bool all_finite(const at::Tensor& t);

/// "parameter <index> of group <group> (shape [..])": the default name of a
/// parameter in messages.
std::string describe_param(const at::Tensor& param, size_t group, size_t index);

/// Raises c10::ValueError "<who>..." for parameters a step cannot update in
/// place (see the top of this header), naming each with `describe` (or
/// describe_param).
void check_steppable(const std::vector<torch::optim::OptimizerParamGroup>& groups, const char* who,
                     const std::function<std::string(size_t, size_t)>& describe = nullptr);

/// Raises c10::ValueError "<who>..." when a defined gradient of `groups`
/// differs from its parameter in shape, dtype, device or layout.
void check_gradients(const std::vector<torch::optim::OptimizerParamGroup>& groups, const char* who,
                     const std::function<std::string(size_t, size_t)>& describe = nullptr);

}  // namespace detail
}  // namespace muon
