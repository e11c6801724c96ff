#pragma once
// Small tensor helpers shared by the optimizer tests.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

namespace muon::test {

/// A parameter: a fresh copy of `values` that requires grad.
inline at::Tensor leaf(const at::Tensor& values) {
  auto t = values.detach().clone();
  t.set_requires_grad(true);
  return t;
}

/// A start and the gradients of a short run, for the tests that resume a run
/// from an archive and compare it with the run straight through.
struct GradientRun {
  /// The parameter's starting values.
  at::Tensor init;
  /// The gradient of each step.
  std::vector<at::Tensor> grads;

  /// Steps `opt`, which holds `p`, through steps [from, to), p's gradient a
  /// copy of that step's.
  void run(at::Tensor& p, torch::optim::Optimizer& opt, int from, int to) const {
    for (int i = from; i < to; ++i) {
      p.mutable_grad() = grads[static_cast<size_t>(i)].clone();
      opt.step();
    }
  }
};

/// `init` and then `steps` gradients, all of `shape`, drawn from the global
/// generator after at::manual_seed(seed).
inline GradientRun gradient_run(uint64_t seed, const std::vector<int64_t>& shape, int steps) {
  at::manual_seed(seed);
  GradientRun r;
  r.init = at::randn(shape);
  for (int i = 0; i < steps; ++i) r.grads.push_back(at::randn(shape));
  return r;
}

}  // namespace muon::test
