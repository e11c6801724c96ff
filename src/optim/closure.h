// What every optimizer's step does first: the loss of the closure it was
// given, computed with gradients on (the step itself runs without). Internal.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

namespace muon::detail {

/// `closure()` with gradient recording on, or an undefined tensor when there
/// is no closure.
inline at::Tensor loss_of(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace muon::detail
