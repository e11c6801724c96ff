#pragma once
// The muon::Muon step written with plain tensor ops in fp64 (momentum, weight
// decay, Newton–Schulz by the textbook formula, scale), and the helpers the
// Muon tests compare the library against it with.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "muon/compat.h"
#include "muon/optim/muon.h"
#include "reference.h"
#include "tensor_util.h"

namespace muon::test {

/// The scale factor of `mode` for a rows×cols matrix, times `extra`.
inline double plain_scale(int64_t rows, int64_t cols, ScaleMode mode, double extra) {
  const double r = static_cast<double>(rows);
  const double c = static_cast<double>(cols);
  switch (mode) {
    case ScaleMode::kShapeScaling:
      return extra * std::sqrt(std::max(1.0, r / c));
    case ScaleMode::kSpectral:
      return extra * std::sqrt(std::max(r, c));
    case ScaleMode::kUnitRmsNorm:
      return extra * std::sqrt(r / c);
    case ScaleMode::kMatchRmsAdamW:
      return extra * 0.2 * std::sqrt(std::max(r, c));
  }
  return 0;
}

/// The options of one reference step, with muon::MuonOptions' defaults.
struct RefOptions {
  double lr = 0.02;
  double mu = 0.95;
  bool nesterov = true;
  bool ema = true;
  double wd = 0.0;
  WeightDecayMode wd_mode = WeightDecayMode::kDecoupled;
  ScaleMode scale = ScaleMode::kShapeScaling;
  double extra = 1.0;
  bool experts = false;
  std::vector<int64_t> split;
  int64_t query_groups = 1;
  NsTuples coeffs = kQuintic;
  int steps = 5;
};

// Orthogonalizes and scales one (rows × cols) matrix, or its fused-QKV blocks:
// block i gathers, from every query group g, the rows
// g·sum(split) + offset_i + [0, split_i), and is orthogonalized on its own.
inline at::Tensor ref_orth_matrix(const at::Tensor& m, const RefOptions& o) {
  const int64_t rows = m.size(0);
  const int64_t cols = m.size(1);
  if (o.split.empty()) {
    return reference_newton_schulz(m, o.coeffs, o.steps) *
           plain_scale(rows, cols, o.scale, o.extra);
  }
  int64_t total = 0;
  for (auto s : o.split) total += s;
  auto out = at::zeros_like(m);
  int64_t offset = 0;
  for (const auto s : o.split) {
    std::vector<int64_t> idx;
    for (int64_t g = 0; g < o.query_groups; ++g) {
      for (int64_t r = 0; r < s; ++r) idx.push_back(g * total + offset + r);
    }
    const auto index = at::tensor(idx, at::kLong);
    const auto block = m.index_select(0, index);
    out.index_copy_(0, index,
                    reference_newton_schulz(block, o.coeffs, o.steps) *
                        plain_scale(block.size(0), cols, o.scale, o.extra));
    offset += s;
  }
  return out;
}

/// One parameter of the reference and its momentum buffer.
struct RefParam {
  at::Tensor p;    // fp64
  at::Tensor buf;  // fp64
};

/// One Muon step of `s` on gradient `g` (any dtype, taken to fp64): weight
/// decay, momentum (EMA or classic, Nesterov or not), Newton–Schulz per
/// matrix, per expert or per QKV block, scaled, times lr.
inline void ref_step(RefParam& s, at::Tensor g, const RefOptions& o) {
  g = g.to(at::kDouble);
  if (!s.buf.defined()) s.buf = at::zeros_like(s.p);
  if (o.wd != 0) {
    if (o.wd_mode == WeightDecayMode::kDecoupled) s.p = s.p * (1 - o.lr * o.wd);
    if (o.wd_mode == WeightDecayMode::kIndependent) s.p = s.p * (1 - o.wd);
    if (o.wd_mode == WeightDecayMode::kPalm) s.p = s.p * (1 - o.lr * o.lr * o.wd);
    if (o.wd_mode == WeightDecayMode::kL2) g = g + o.wd * s.p;
  }
  s.buf = o.ema ? o.mu * s.buf + (1 - o.mu) * g : o.mu * s.buf + g;
  at::Tensor u = s.buf;
  if (o.nesterov) u = o.ema ? (1 - o.mu) * g + o.mu * s.buf : g + o.mu * s.buf;
  at::Tensor orth;
  if (o.experts && u.dim() >= 3) {
    std::vector<at::Tensor> per_expert;
    for (int64_t e = 0; e < u.size(0); ++e) {
      per_expert.push_back(ref_orth_matrix(u[e].reshape({u.size(1), -1}), o));
    }
    orth = at::stack(per_expert);
  } else {
    orth = ref_orth_matrix(u.reshape({u.size(0), -1}), o);
  }
  s.p = s.p - o.lr * orth.reshape(s.p.sizes());
}

/// The muon::MuonOptions of `o`, with fp64 Newton–Schulz compute.
inline MuonOptions to_muon(const RefOptions& o) {
  MuonOptions m(o.lr);
  m.momentum(o.mu)
      .nesterov(o.nesterov)
      .momentum_style(o.ema ? MomentumStyle::kEma : MomentumStyle::kClassic)
      .weight_decay(o.wd)
      .weight_decay_mode(o.wd_mode)
      .scale_mode(o.scale)
      .extra_scale_factor(o.extra)
      .stacked_experts(o.experts)
      .split_sizes(o.split)
      .num_query_groups(o.query_groups)
      .ns_steps(o.steps)
      .ns_compute_dtype(at::kDouble);
  m.ns_coefficients(o.coeffs == kSimple ? "simple" : "quintic");
  return m;
}

/// Largest absolute difference of two tensors, in fp64.
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

/// The Muon state of parameter `p`.
inline const MuonParamState& state_of(const Muon& opt, const at::Tensor& p) {
  return static_cast<const MuonParamState&>(*opt.state().at(muon::compat::state_key(p)));
}

// Runs `steps` steps of the library and of the reference on parameters of
// `shapes` (fp64, fp64 NS compute) with fresh random gradients each step and
// returns the largest difference of parameters and momentum buffers.
inline double run_against_reference(const std::vector<std::vector<int64_t>>& shapes,
                                    const RefOptions& o, int steps = 4) {
  at::manual_seed(1234);
  std::vector<at::Tensor> params;
  std::vector<RefParam> ref;
  for (const auto& shape : shapes) {
    params.push_back(leaf(at::randn(shape, at::kDouble)));
    ref.push_back({params.back().detach().clone(), {}});
  }
  Muon opt(params, to_muon(o));
  double worst = 0;
  for (int k = 0; k < steps; ++k) {
    for (size_t i = 0; i < params.size(); ++i) {
      const auto g = at::randn(shapes[i], at::kDouble);
      params[i].mutable_grad() = g.clone();
      ref_step(ref[i], g, o);
    }
    opt.step();
    for (size_t i = 0; i < params.size(); ++i) {
      worst = std::max(worst, max_diff(params[i], ref[i].p));
      worst = std::max(worst, max_diff(state_of(opt, params[i]).momentum_buffer(), ref[i].buf));
    }
  }
  return worst;
}

// fp64 throughout, the same polynomial on both sides: the only differences
// are rounding (SYRK vs GEMM, Gram vs standard evaluation, folded
// polynomial), ~1e-16 relative per operation and amplified at most by the
// polynomial's slope (< 5 per step over 5 steps, < 1e4 in all) on O(1)
// values: 1e-10 leaves a wide margin and still catches any wrong term
// (lr·scale·update is ~1e-3 or more).
inline constexpr double kFp64Tol = 1e-10;

}  // namespace muon::test
