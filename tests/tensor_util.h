#pragma once
// Small tensor helpers shared by the optimizer tests.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "expect_util.h"

namespace muon::test {

/// A parameter: a fresh copy of `values` that requires grad.
inline at::Tensor leaf(const at::Tensor& values) {
  auto t = values.detach().clone();
  t.set_requires_grad(true);
  return t;
}

/// Largest |got − want| relative to the largest |want|, in fp64 (got
/// reshaped to want's shape).
inline double relative(const at::Tensor& got, const at::Tensor& want) {
  const auto w = want.to(at::kDouble);
  return (got.to(at::kDouble).reshape(w.sizes()) - w).abs().max().item<double>() / w.abs().max().item<double>();
}

/// `got` in fp64 with each column's sign turned to agree with `want`'s: for
/// factors defined up to the sign of each column (QR, SVD, eigenvectors).
inline at::Tensor signs_aligned(const at::Tensor& got, const at::Tensor& want) {
  const auto g = got.to(at::kDouble);
  const auto s = (g * want.to(at::kDouble)).sum(0, /*keepdim=*/true).sign();
  return g * at::where(s.eq(0), at::ones_like(s), s);
}

/// A `Module` (a torch::nn module holder) built from `args` right after
/// at::manual_seed(seed): the same initial values for the same seed.
template <typename Module, typename... Args>
Module seeded_module(uint64_t seed, Args&&... args) {
  at::manual_seed(seed);
  return Module(std::forward<Args>(args)...);
}

/// Gives `p` a gradient of ones and takes one step of `opt`.
template <typename Optimizer>
void step_with_ones(Optimizer& opt, at::Tensor& p) {
  p.mutable_grad() = at::ones_like(p);
  opt.step();
}

/// An lr of -0.5 set between steps of an Optimizer over `p` is caught by the
/// next step, which raises c10::ValueError naming it and changes neither `p`
/// nor the (empty) state.
template <typename Optimizer>
void expect_negative_lr_edit_caught(at::Tensor p) {
  Optimizer opt({p});
  opt.param_groups()[0].options().set_lr(-0.5);
  p.mutable_grad() = at::ones_like(p);
  const auto before = p.detach().clone();
  expect_value_error([&] { opt.step(); }, {"lr", "-0.5"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_TRUE(opt.state().empty());
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

/// Parameters of `shapes` drawn from the global generator after
/// at::manual_seed(seed), each with its fp64 `Reference` (built from it), for
/// the tests that check an optimizer's steps against the published update.
template <typename Reference>
struct ReferenceRun {
  std::vector<at::Tensor> params;
  std::vector<Reference> refs;
  std::vector<std::vector<int64_t>> shapes;

  ReferenceRun(const std::vector<std::vector<int64_t>>& shapes_, uint64_t seed) : shapes(shapes_) {
    at::manual_seed(seed);
    for (const auto& s : shapes) {
      params.push_back(leaf(at::randn(s)));
      refs.emplace_back(params.back());
    }
  }

  /// `steps` steps of `opt` (which holds `params`): each draws every
  /// parameter's gradient from the global generator, gives a copy to the
  /// parameter and the gradient to its reference's step(g, h).
  template <typename Hyper>
  void run(torch::optim::Optimizer& opt, const Hyper& h, int steps) {
    for (int step = 0; step < steps; ++step) {
      for (size_t k = 0; k < params.size(); ++k) {
        const auto g = at::randn(shapes[k]);
        params[k].mutable_grad() = g.clone();
        refs[k].step(g, h);
      }
      opt.step();
    }
  }

  /// The references' values of every parameter, one after another.
  std::vector<double> values() const {
    std::vector<double> out;
    for (const auto& r : refs) out.insert(out.end(), r.p.begin(), r.p.end());
    return out;
  }
};

/// A matrix by its thin SVD u·diag(s)·vᵀ, for the spectral tests.
struct Svd {
  at::Tensor u;  // (m, k)
  at::Tensor s;  // (k)
  at::Tensor v;  // (n, k)
  /// u·diag(s)·vᵀ.
  at::Tensor x() const { return at::matmul(u * s, v.transpose(0, 1)); }
  /// u·diag(f)·vᵀ: the singular values replaced by `f`.
  at::Tensor with(const at::Tensor& f) const { return at::matmul(u * f, v.transpose(0, 1)); }
};

}  // namespace muon::test
