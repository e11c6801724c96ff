// One agreement per step over a layout's processes (muon/distributed/layouts/layout.h):
// gradients present and fitting, the optimizer's own checks, a digest of its
// settings and the non-finite policy, in one all-gather of a few integers.
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/distributed/runtime/group.h"

namespace muon::distributed::detail {

/// What a step's agreement checks on this rank.
struct StepCheck {
  /// The tensors whose `.grad()` the step reduces (or steps as they are),
  /// by name, in an order every rank shares.
  const torch::OrderedDict<std::string, at::Tensor>* params = nullptr;
  /// The optimizer that steps after the reduction.
  torch::optim::Optimizer* optimizer = nullptr;
  /// Ranks whose gradients are summed by the reduction (1: none).
  int64_t reduced_over = 1;
  /// Whether the ranks' optimizers hold the same param groups, whose
  /// settings are compared (not in the layer-wise layout: each rank's holds
  /// the groups of the parameters it owns).
  bool same_groups = true;
  /// Prefix of messages, e.g. "[muon::distributed::Layout] ".
  const char* who = "";
};

/// What the ranks agreed on.
struct StepVerdict {
  /// Which of `params` have a gradient (the same on every rank).
  std::vector<bool> active;
  /// Every rank skips this step (skip_step policy, a non-finite gradient).
  bool skip = false;
  /// A gradient is so large that the sum of the ranks' gradients might
  /// overflow: the reduced gradients must be checked again
  /// (agree_reduced_finite).
  bool recheck = false;
};

/// The step's agreement: one all-gather over `group`, then (without a
/// group spanning every rank of the layout) the outcome passed on over
/// each of `peers`. Raises the same c10::ValueError on every rank when a
/// rank's checks failed, the ranks differ in which gradients they have or
/// in their settings (naming the first difference), a gradient does not fit
/// its parameter, or (error policy) a gradient is not finite; nothing has
/// changed then.
StepVerdict agree_step(const Group& group, const std::vector<const Group*>& peers,
                       const StepCheck& check);

/// After the reduction of a step whose verdict asked for a recheck: whether
/// every reduced gradient in `grads` (this rank's, by name) is finite,
/// agreed over `group` (then `peers`). Returns true to skip the step
/// (skip_step), raises c10::ValueError naming the parameter and the rank
/// (error policy), or returns false when all are finite.
bool agree_reduced_finite(const Group& group, const std::vector<const Group*>& peers,
                          const torch::OrderedDict<std::string, at::Tensor>& grads,
                          torch::optim::Optimizer& optimizer, const char* who);

}  // namespace muon::distributed::detail
