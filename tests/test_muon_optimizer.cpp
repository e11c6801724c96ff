// Tests of muon::Muon: exact values against a plain reference step, shapes,
// options, schedulers, save/load, errors and convergence.
#include <gtest/gtest.h>

#include "archive_util.h"
#include "expect_util.h"
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/step_lr.h>
#include <ATen/Parallel.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "muon/compat.h"
#include "muon/optim/muon.h"
#include "kernels/symmetric.h"
#include "optim/muon_internal.h"

namespace {

using muon::test::expect_value_error;

using muon::MomentumStyle;
using muon::Muon;
using muon::MuonOptions;
using muon::MuonParamState;
using muon::ScaleMode;
using muon::WeightDecayMode;

// ---- the reference step, written with plain tensor ops -----------------------

using Coeffs = std::vector<std::array<double, 3>>;

// You's quintic schedule (cycled) and Jordan's single tuple, from REFERENCE.md.
const Coeffs kQuintic = {{4.0848, -6.8946, 2.9270},
                         {3.9505, -6.3029, 2.6377},
                         {3.7418, -5.5913, 2.3037},
                         {2.8769, -3.1427, 1.2046},
                         {2.8366, -3.0525, 1.2012}};
const Coeffs kSimple = {{3.4445, -4.7750, 2.0315}};

// Newton–Schulz in fp64, the textbook formula on the short side.
at::Tensor plain_ns(const at::Tensor& g, const Coeffs& coeffs, int steps, double eps = 1e-7) {
  auto x = g.to(at::kDouble);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / (x.norm() + eps);
  for (int k = 0; k < steps; ++k) {
    const auto& abc = coeffs[static_cast<size_t>(k) % coeffs.size()];
    const auto a_mat = x.mm(x.t());
    const auto b_mat = abc[1] * a_mat + abc[2] * a_mat.mm(a_mat);
    x = abc[0] * x + b_mat.mm(x);
  }
  return tall ? x.t() : x;
}

double plain_scale(int64_t rows, int64_t cols, ScaleMode mode, double extra) {
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
  Coeffs coeffs = kQuintic;
  int steps = 5;
};

// Orthogonalizes and scales one (rows × cols) matrix, or its fused-QKV blocks:
// block i gathers, from every query group g, the rows
// g·sum(split) + offset_i + [0, split_i), and is orthogonalized on its own.
at::Tensor ref_orth_matrix(const at::Tensor& m, const RefOptions& o) {
  const int64_t rows = m.size(0);
  const int64_t cols = m.size(1);
  if (o.split.empty()) return plain_ns(m, o.coeffs, o.steps) * plain_scale(rows, cols, o.scale, o.extra);
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
                    plain_ns(block, o.coeffs, o.steps) * plain_scale(block.size(0), cols, o.scale, o.extra));
    offset += s;
  }
  return out;
}

struct RefParam {
  at::Tensor p;    // fp64
  at::Tensor buf;  // fp64
};

void ref_step(RefParam& s, at::Tensor g, const RefOptions& o) {
  g = g.to(at::kDouble);
  if (!s.buf.defined()) s.buf = at::zeros_like(s.p);
  if (o.wd != 0) {
    if (o.wd_mode == WeightDecayMode::kDecoupled) s.p = s.p * (1 - o.lr * o.wd);
    if (o.wd_mode == WeightDecayMode::kIndependent) s.p = s.p * (1 - o.wd);
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

MuonOptions to_muon(const RefOptions& o) {
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

at::Tensor leaf(const at::Tensor& values) {
  auto t = values.detach().clone();
  t.set_requires_grad(true);
  return t;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

const MuonParamState& state_of(const Muon& opt, const at::Tensor& p) {
  return static_cast<const MuonParamState&>(*opt.state().at(muon::compat::state_key(p)));
}

// Runs `steps` steps of the library and of the reference on parameters of
// `shapes` (fp64, fp64 NS compute) with fresh random gradients each step and
// returns the largest difference of parameters and momentum buffers.
double run_against_reference(const std::vector<std::vector<int64_t>>& shapes, const RefOptions& o,
                             int steps = 4) {
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
constexpr double kFp64Tol = 1e-10;

// ---- exact values over the option combinations -------------------------------

struct Combo {
  bool nesterov;
  MomentumStyle style;
  WeightDecayMode wd_mode;
  ScaleMode scale;
};

std::string combo_name(const Combo& c) {
  return std::string(c.nesterov ? "nesterov_" : "plain_") + muon::to_string(c.style) + "_" +
         muon::to_string(c.wd_mode) + "_" + muon::to_string(c.scale);
}

// gtest prints parameters with this (readable ctest names).
void PrintTo(const Combo& c, std::ostream* os) { *os << combo_name(c); }

// The reference options of one combination (lr 0.05, μ 0.9, wd 0.1, extra
// scale 1.5: every term visible in the result).
RefOptions combo_options(const Combo& c) {
  RefOptions o;
  o.lr = 0.05;
  o.mu = 0.9;
  o.nesterov = c.nesterov;
  o.ema = c.style == MomentumStyle::kEma;
  o.wd = 0.1;
  o.wd_mode = c.wd_mode;
  o.scale = c.scale;
  o.extra = 1.5;
  return o;
}

class ExactValues : public ::testing::TestWithParam<Combo> {};

TEST_P(ExactValues, MatchesPlainReferenceStep) {
  const RefOptions o = combo_options(GetParam());
  // tall, wide (standard iteration), very wide (Gram iteration under auto), square
  EXPECT_LT(run_against_reference({{12, 8}, {6, 10}, {4, 16}, {7, 7}}, o), kFp64Tol);
}

std::vector<Combo> all_combos() {
  std::vector<Combo> out;
  for (bool n : {true, false}) {
    for (auto s : {MomentumStyle::kEma, MomentumStyle::kClassic}) {
      for (auto w : {WeightDecayMode::kDecoupled, WeightDecayMode::kIndependent, WeightDecayMode::kL2}) {
        for (auto m : {ScaleMode::kShapeScaling, ScaleMode::kSpectral, ScaleMode::kUnitRmsNorm,
                       ScaleMode::kMatchRmsAdamW}) {
          out.push_back({n, s, w, m});
        }
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllOptions, ExactValues, ::testing::ValuesIn(all_combos()),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           return combo_name(info.param);
                         });

// ---- fp32 parameters: the fused passes and the tensor-op step ---------------

// `values` with the same entries stored in reversed dimension order: a
// non-contiguous tensor, which muon::Muon steps with tensor ops instead of
// its fused passes.
at::Tensor reversed_storage(const at::Tensor& values) {
  std::vector<int64_t> rev(static_cast<size_t>(values.dim()));
  for (int64_t d = 0; d < values.dim(); ++d) rev[static_cast<size_t>(d)] = values.dim() - 1 - d;
  return values.permute(rev).contiguous().permute(rev);
}

// Steps fp32 parameters of `shapes` (N(0, 0.02²), contiguous or not) and
// the fp64 reference on the same fp32 gradients; returns the largest
// ‖Δp − Δp_ref‖_F / ‖Δp_ref‖_F over parameters, Δp the change over all steps.
double fp32_error_against_reference(const std::vector<std::vector<int64_t>>& shapes,
                                    const RefOptions& o, bool contiguous,
                                    at::ScalarType compute, int steps = 3) {
  at::manual_seed(99);
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> start;
  std::vector<RefParam> ref;
  for (const auto& shape : shapes) {
    const auto values = at::randn(shape) * 0.02;
    params.push_back(leaf(contiguous ? values : reversed_storage(values)));
    EXPECT_EQ(params.back().is_contiguous(), contiguous);
    start.push_back(values.to(at::kDouble));
    ref.push_back({start.back().clone(), {}});
  }
  auto options = to_muon(o);
  options.ns_compute_dtype(compute);
  Muon opt(params, options);
  for (int k = 0; k < steps; ++k) {
    for (size_t i = 0; i < params.size(); ++i) {
      const auto g = at::randn(shapes[i]);
      params[i].mutable_grad() = contiguous ? g.clone() : reversed_storage(g);
      ref_step(ref[i], g, o);
    }
    opt.step();
  }
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto d_ref = ref[i].p - start[i];
    const auto d = params[i].detach().to(at::kDouble) - start[i];
    worst = std::max(worst, ((d - d_ref).norm() / d_ref.norm()).item<double>());
  }
  return worst;
}

// fp32 compute: Newton–Schulz in fp32 differs from fp64 by ~1e-6 relative
// (docs/benchmarks.md), the elementwise passes by a few fp32 roundings;
// 1e-5 keeps a margin and catches any wrong term (a missing Nesterov or
// weight-decay term changes Δp by > 1e-2). bf16 compute: the bf16 iterate's
// rounding puts Newton–Schulz ~4e-3–9e-3 from fp64 (the plain bf16 formula:
// ~1.7e-2); 3e-2 is the plain formula's error with a margin.
constexpr double kFp32StepTol = 1e-5;
constexpr double kBf16StepTol = 3e-2;

class Fp32Steps : public ::testing::TestWithParam<Combo> {};

TEST_P(Fp32Steps, FusedAndTensorOpStepsMatchFp64Reference) {
  const RefOptions o = combo_options(GetParam());
  const std::vector<std::vector<int64_t>> shapes = {{48, 32}, {24, 40}, {16, 64}, {28, 28}};
  for (const bool contiguous : {true, false}) {
    EXPECT_LT(fp32_error_against_reference(shapes, o, contiguous, at::kFloat), kFp32StepTol)
        << (contiguous ? "fused passes" : "tensor ops");
    EXPECT_LT(fp32_error_against_reference(shapes, o, contiguous, at::kBFloat16), kBf16StepTol)
        << (contiguous ? "fused passes" : "tensor ops") << ", bf16 compute";
  }
}

INSTANTIATE_TEST_SUITE_P(AllOptions, Fp32Steps, ::testing::ValuesIn(all_combos()),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           return combo_name(info.param);
                         });

TEST(MuonShapes, Fp32ExpertsAndConvNormalizedPerMatrix) {
  // The fused passes sum ‖u‖² per expert: one norm over the whole stack
  // would scale each expert's update by a different factor.
  RefOptions o;
  o.experts = true;
  o.scale = ScaleMode::kSpectral;
  o.wd = 0.01;
  for (const bool contiguous : {true, false}) {
    EXPECT_LT(fp32_error_against_reference({{3, 24, 40}, {8, 3, 3, 3}}, o, contiguous, at::kFloat),
              kFp32StepTol);
  }
}

// Several threads run the fused parameters side by side, one matrix per
// thread with every product and loop of that matrix on its thread alone:
// the parameters must come out as at one thread, to the bit, whichever
// thread took which matrix. A QKV-split group (not fused) runs alongside.
TEST(MuonThreads, SideBySideMatricesGiveTheOneThreadBits) {
  const int before = at::get_num_threads();
  for (const auto compute : {at::kBFloat16, at::kFloat}) {
    auto run = [&](int threads) {
      at::set_num_threads(threads);
      at::manual_seed(11);
      std::vector<at::Tensor> fused;
      for (const auto& shape : std::vector<std::vector<int64_t>>{
               {96, 256}, {256, 96}, {128, 128}, {2, 64, 160}, {32, 16, 3, 3}, {40, 24}}) {
        fused.push_back(at::randn(shape).requires_grad_(true));
      }
      auto qkv = at::randn({48, 32}).requires_grad_(true);
      auto o = MuonOptions(0.05).weight_decay(0.1).stacked_experts(true);
      o.ns().compute_dtype(compute);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(fused, std::make_unique<MuonOptions>(o));
      groups.emplace_back(std::vector<at::Tensor>{qkv},
                          std::make_unique<MuonOptions>(MuonOptions(o).split_sizes({16, 16, 16})));
      Muon opt(std::move(groups));
      fused.push_back(qkv);
      for (int k = 0; k < 3; ++k) {
        for (auto& p : fused) p.mutable_grad() = at::randn(p.sizes());
        opt.step();
      }
      return fused;
    };
    const auto one = run(1);
    const auto runs = muon::detail::side_by_side_steps();
    const auto two = run(2);
    at::set_num_threads(before);
    if (muon::detail::products_follow_thread_scope(compute)) {
      EXPECT_EQ(muon::detail::side_by_side_steps(), runs + 3) << compute;
      for (size_t i = 0; i < one.size(); ++i) {
        EXPECT_TRUE(at::equal(one[i], two[i])) << compute << ", parameter " << i;
      }
    } else {
      // Products on a BLAS with its own threads: one matrix at a time.
      EXPECT_EQ(muon::detail::side_by_side_steps(), runs) << compute;
    }
  }
}

// A tensor listed in two groups takes two updates on one state, in group
// order: those must not run side by side.
TEST(MuonThreads, TensorInTwoGroupsKeepsItsUpdatesInOrder) {
  const int before = at::get_num_threads();
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    at::manual_seed(12);
    auto p = at::randn({128, 256}).requires_grad_(true);
    auto q = at::randn({256, 128}).requires_grad_(true);
    auto o = MuonOptions(0.05);
    o.ns().compute_dtype(at::kBFloat16);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{p, q}, std::make_unique<MuonOptions>(o));
    groups.emplace_back(std::vector<at::Tensor>{p},
                        std::make_unique<MuonOptions>(MuonOptions(o).lr(0.01)));
    Muon opt(std::move(groups));
    for (int k = 0; k < 2; ++k) {
      p.mutable_grad() = at::randn(p.sizes());
      q.mutable_grad() = at::randn(q.sizes());
      opt.step();
    }
    return std::vector<at::Tensor>{p, q};
  };
  const auto one = run(1);
  const auto runs = muon::detail::side_by_side_steps();
  const auto two = run(2);
  at::set_num_threads(before);
  EXPECT_EQ(muon::detail::side_by_side_steps(), runs);
  EXPECT_TRUE(at::equal(one[0], two[0]));
  EXPECT_TRUE(at::equal(one[1], two[1]));
}

TEST(MuonShapes, ConvWeightViewedAsOutByRest) {
  RefOptions o;
  o.scale = ScaleMode::kSpectral;  // depends on both dims: a kh/kw scale would differ
  o.wd = 0.01;
  EXPECT_LT(run_against_reference({{8, 3, 3, 3}, {4, 2, 5}}, o), kFp64Tol);
}

TEST(MuonShapes, ChannelsLastConvWeight) {
  RefOptions o;
  at::manual_seed(7);
  const auto values = at::randn({6, 4, 3, 3}, at::kDouble);
  auto p = leaf(values.contiguous(at::MemoryFormat::ChannelsLast));
  RefParam ref{values.clone(), {}};
  Muon opt({p}, to_muon(o));
  for (int k = 0; k < 3; ++k) {
    const auto g = at::randn({6, 4, 3, 3}, at::kDouble);
    p.mutable_grad() = g.contiguous(at::MemoryFormat::ChannelsLast);
    ref_step(ref, g, o);
    opt.step();
  }
  EXPECT_LT(max_diff(p, ref.p), kFp64Tol);
}

TEST(MuonShapes, StackedExpertsOrthogonalizedPerExpert) {
  RefOptions o;
  o.experts = true;
  o.scale = ScaleMode::kSpectral;
  EXPECT_LT(run_against_reference({{3, 6, 10}, {2, 12, 4}, {5, 8}}, o), kFp64Tol);
}

TEST(MuonShapes, ExpertsWithoutGroupFlagAreOneMatrix) {
  // Without stacked_experts a 3-D parameter is a conv-style (E, out·in) matrix.
  RefOptions o;
  EXPECT_LT(run_against_reference({{3, 6, 10}}, o), kFp64Tol);
}

TEST(MuonShapes, FusedQkvSplitOneNsPerBlock) {
  RefOptions o;
  o.split = {6, 3, 3};
  o.scale = ScaleMode::kSpectral;
  EXPECT_LT(run_against_reference({{12, 10}}, o), kFp64Tol);
}

TEST(MuonShapes, FusedQkvSplitPerQueryGroup) {
  RefOptions o;
  o.split = {4, 2, 2};
  o.query_groups = 2;
  o.scale = ScaleMode::kUnitRmsNorm;
  EXPECT_LT(run_against_reference({{16, 12}}, o), kFp64Tol);
}

TEST(MuonShapes, FusedQkvWithOutputGate) {
  RefOptions o;
  o.split = {4, 4, 2, 2};  // [q, gate, k, v]
  o.query_groups = 3;
  EXPECT_LT(run_against_reference({{36, 10}}, o), kFp64Tol);
}

TEST(MuonShapes, SplitDiffersFromWholeMatrix) {
  // Guards the test above against a split that silently does nothing.
  RefOptions split;
  split.split = {6, 3, 3};
  RefOptions whole;
  at::manual_seed(3);
  const auto g = at::randn({12, 10}, at::kDouble);
  EXPECT_GT(max_diff(ref_orth_matrix(g, split), ref_orth_matrix(g, whole)), 1e-2);
}

TEST(MuonOptionsTest, OtherCoefficientSetAndSteps) {
  RefOptions o;
  o.coeffs = kSimple;
  o.steps = 3;
  EXPECT_LT(run_against_reference({{10, 6}}, o), kFp64Tol);
}

TEST(MuonOptionsTest, ZeroMomentumIsPlainOrthogonalizedGradient) {
  RefOptions o;
  o.mu = 0.0;
  o.nesterov = false;
  EXPECT_LT(run_against_reference({{5, 9}}, o), kFp64Tol);
}

// ---- dtypes -------------------------------------------------------------------

TEST(MuonDtypes, Bf16ParameterUpdatedInItsDtype) {
  RefOptions o;
  o.lr = 0.2;
  at::manual_seed(11);
  const auto values = at::randn({16, 8});
  auto p = leaf(values.to(at::kBFloat16));
  RefParam ref{p.detach().to(at::kDouble), {}};
  auto mo = to_muon(o);
  mo.ns_compute_dtype(at::kFloat);
  Muon opt({p}, mo);
  for (int k = 0; k < 3; ++k) {
    const auto g = at::randn({16, 8}).to(at::kBFloat16);
    p.mutable_grad() = g;
    ref_step(ref, g, o);
    opt.step();
  }
  EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  EXPECT_EQ(state_of(opt, p).momentum_buffer().scalar_type(), at::kBFloat16);
  // The parameter (|p| < 4) is rounded to bf16 at every step: half an ulp
  // ≤ 2^-7 ≈ 0.008, three steps ≤ 0.024; the bf16 buffer perturbs the update
  // direction by ~0.4%. The updates themselves move p by ≈ 3·lr·√2·0.35 ≈ 0.3,
  // so a missing or wrong update fails the bound.
  EXPECT_LT(max_diff(p, ref.p), 0.05);
}

TEST(MuonDtypes, Bf16ComputeOnFp32Parameter) {
  RefOptions o;
  at::manual_seed(12);
  auto p = leaf(at::randn({32, 16}));
  RefParam ref{p.detach().to(at::kDouble), {}};
  auto mo = to_muon(o);
  mo.ns_compute_dtype(at::kBFloat16);
  Muon opt({p}, mo);
  for (int k = 0; k < 3; ++k) {
    const auto g = at::randn({32, 16});
    p.mutable_grad() = g;
    ref_step(ref, g, o);
    opt.step();
  }
  EXPECT_EQ(p.scalar_type(), at::kFloat);
  // bf16 NS output entries carry ~1% relative error of the O(1/sqrt(16))
  // entries; times lr·scale = 0.02·sqrt(2) over 3 steps: ≲ 3·0.03·0.25·0.01
  // = 2e-4 expected, 2e-3 bound. Without the update at all the difference
  // would be ~0.03.
  EXPECT_LT(max_diff(p, ref.p), 2e-3);
}

// ---- step semantics ------------------------------------------------------------

TEST(MuonStep, ParametersWithoutGradientAreSkipped) {
  auto a = leaf(at::randn({4, 6}));
  auto b = leaf(at::randn({6, 4}));
  const auto b_before = b.detach().clone();
  Muon opt({a, b});
  a.mutable_grad() = at::randn({4, 6});
  opt.step();
  EXPECT_TRUE(at::equal(b, b_before));
  EXPECT_EQ(opt.state().count(muon::compat::state_key(b)), 0u);
  EXPECT_EQ(state_of(opt, a).step(), 1);
  opt.step();
  EXPECT_EQ(state_of(opt, a).step(), 2);
}

TEST(MuonStep, ClosureRunsWithGradModeAndLossIsReturned) {
  auto w = leaf(at::randn({5, 3}));
  const auto x = at::randn({8, 5});
  Muon opt({w});
  bool grad_mode_seen = false;
  auto closure = [&] {
    grad_mode_seen = at::GradMode::is_enabled();
    opt.zero_grad();
    auto loss = x.mm(w).pow(2).mean();
    loss.backward();
    return loss;
  };
  at::NoGradGuard outer;  // the closure must still get grad mode
  const auto before = w.detach().clone();
  const auto loss = opt.step(closure);
  EXPECT_TRUE(grad_mode_seen);
  ASSERT_TRUE(loss.defined());
  EXPECT_GT(loss.item<double>(), 0.0);
  EXPECT_FALSE(at::equal(w, before));
}

TEST(MuonStep, NeitherGradNorBufferIsMutatedByOrthogonalization) {
  for (bool nesterov : {false, true}) {
    at::manual_seed(5);
    auto p = leaf(at::randn({10, 6}));
    Muon opt({p}, MuonOptions(0.1).nesterov(nesterov).momentum(0.9).weight_decay(0.1).weight_decay_mode("l2"));
    at::Tensor expected_buf = at::zeros({10, 6});
    for (int k = 0; k < 3; ++k) {
      const auto g = at::randn({10, 6});
      p.mutable_grad() = g.clone();
      const auto p_before = p.detach().clone();
      opt.step();
      EXPECT_TRUE(at::equal(p.grad(), g)) << "p.grad() was modified";
      // EMA buffer of the l2-augmented gradient, in plain ops (fp32 rounding
      // of a few operations: 1e-6 on O(1) values).
      expected_buf = 0.9 * expected_buf + 0.1 * (g + 0.1 * p_before);
      EXPECT_LT(max_diff(state_of(opt, p).momentum_buffer(), expected_buf), 1e-6);
    }
  }
}

TEST(MuonStep, PerGroupOptionsSurviveConstruction) {
  at::manual_seed(21);
  const auto v1 = at::randn({8, 6}, at::kDouble);
  const auto v2 = at::randn({6, 8}, at::kDouble);
  auto p1 = leaf(v1);
  auto p2 = leaf(v2);
  RefOptions o1;
  o1.lr = 0.1;
  o1.mu = 0.5;
  RefOptions o2;
  o2.lr = 0.01;
  o2.mu = 0.9;
  o2.ema = false;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p1}, std::make_unique<MuonOptions>(to_muon(o1)));
  groups.emplace_back(std::vector<at::Tensor>{p2}, std::make_unique<MuonOptions>(to_muon(o2)));
  Muon opt(std::move(groups), MuonOptions(0.5));
  EXPECT_EQ(static_cast<const MuonOptions&>(opt.param_groups()[0].options()), to_muon(o1));
  EXPECT_EQ(static_cast<const MuonOptions&>(opt.param_groups()[1].options()), to_muon(o2));
  RefParam r1{v1.clone(), {}};
  RefParam r2{v2.clone(), {}};
  for (int k = 0; k < 3; ++k) {
    const auto g1 = at::randn({8, 6}, at::kDouble);
    const auto g2 = at::randn({6, 8}, at::kDouble);
    p1.mutable_grad() = g1;
    p2.mutable_grad() = g2;
    ref_step(r1, g1, o1);
    ref_step(r2, g2, o2);
    opt.step();
  }
  EXPECT_LT(max_diff(p1, r1.p), kFp64Tol);
  EXPECT_LT(max_diff(p2, r2.p), kFp64Tol);
}

TEST(MuonStep, GroupWithoutOptionsGetsDefaults) {
  auto p = leaf(at::randn({4, 4}));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p});
  Muon opt(std::move(groups), MuonOptions(0.3).momentum(0.8));
  EXPECT_EQ(static_cast<const MuonOptions&>(opt.param_groups()[0].options()),
            MuonOptions(0.3).momentum(0.8));
}

// ---- schedulers ---------------------------------------------------------------

TEST(MuonSchedulers, GetAndSetLr) {
  MuonOptions o(0.05);
  EXPECT_EQ(o.get_lr(), 0.05);
  o.set_lr(0.01);
  EXPECT_EQ(o.lr(), 0.01);
}

TEST(MuonSchedulers, StepLrDrivesEveryGroup) {
  at::manual_seed(31);
  const auto v = at::randn({6, 4}, at::kDouble);
  auto p = leaf(v);
  auto q = leaf(at::randn({4, 4}, at::kDouble));
  RefOptions o;
  o.lr = 0.08;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p}, std::make_unique<MuonOptions>(to_muon(o)));
  groups.emplace_back(std::vector<at::Tensor>{q}, std::make_unique<MuonOptions>(to_muon(o).lr(0.2)));
  Muon opt(std::move(groups));
  torch::optim::StepLR sched(opt, /*step_size=*/2, /*gamma=*/0.5);
  RefParam ref{v.clone(), {}};
  std::vector<double> used;
  for (int k = 0; k < 6; ++k) {
    const auto g = at::randn({6, 4}, at::kDouble);
    p.mutable_grad() = g;
    o.lr = opt.param_groups()[0].options().get_lr();  // what the scheduler set
    used.push_back(o.lr);
    ref_step(ref, g, o);
    opt.step();
    sched.step();
  }
  // Decayed at least twice, every group by the same factor.
  const double lr0 = opt.param_groups()[0].options().get_lr();
  const double lr1 = opt.param_groups()[1].options().get_lr();
  EXPECT_LE(lr0, 0.08 * 0.25 * (1 + 1e-12));
  EXPECT_DOUBLE_EQ(lr1 / lr0, 0.2 / 0.08);
  EXPECT_GT(used.front(), used.back());
  EXPECT_LT(max_diff(p, ref.p), kFp64Tol);
}

// Linear warm-up, as a user-written LRScheduler.
class Warmup : public torch::optim::LRScheduler {
 public:
  Warmup(torch::optim::Optimizer& opt, double peak, unsigned steps)
      : LRScheduler(opt), peak_(peak), steps_(steps) {}

 private:
  std::vector<double> get_lrs() override {
    const double lr = peak_ * std::min(1.0, static_cast<double>(step_count_ + 1) / steps_);
    return std::vector<double>(get_current_lrs().size(), lr);
  }
  double peak_;
  unsigned steps_;
};

TEST(MuonSchedulers, CustomSchedulerSetsLr) {
  auto p = leaf(at::randn({4, 4}));
  Muon opt({p}, MuonOptions(0.0));
  Warmup sched(opt, 0.04, 4);
  std::vector<double> seen;
  for (int k = 0; k < 5; ++k) {
    sched.step();
    seen.push_back(opt.param_groups()[0].options().get_lr());
  }
  EXPECT_DOUBLE_EQ(seen[0], 0.01);
  EXPECT_DOUBLE_EQ(seen[2], 0.03);
  EXPECT_DOUBLE_EQ(seen[4], 0.04);
}

// ---- save / load --------------------------------------------------------------

using muon::test::load_from_string;
using muon::test::save_to_string;

std::vector<torch::optim::OptimizerParamGroup> two_groups(const std::vector<at::Tensor>& p) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p[0], p[1]},
                      std::make_unique<MuonOptions>(MuonOptions(0.05).weight_decay(0.1)));
  groups.emplace_back(std::vector<at::Tensor>{p[2], p[3]},
                      std::make_unique<MuonOptions>(MuonOptions(0.02)
                                                        .momentum_style("classic")
                                                        .nesterov(false)
                                                        .ns_compute_dtype(at::kBFloat16)
                                                        .scale_mode("spectral")
                                                        .extra_scale_factor(0.2)));
  return groups;
}

TEST(MuonSaveLoad, ResumedRunIsBitIdentical) {
  const std::vector<std::vector<int64_t>> shapes = {{16, 8}, {8, 3, 3}, {8, 24}, {5, 5}};
  at::manual_seed(41);
  std::vector<at::Tensor> init;
  for (const auto& s : shapes) init.push_back(at::randn(s));
  std::vector<std::vector<at::Tensor>> grads(6);
  for (auto& step_grads : grads) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      // parameter 3 never gets a gradient: it must stay without state
      step_grads.push_back(i == 3 ? at::Tensor() : at::randn(shapes[i]));
    }
  }
  auto run = [&](std::vector<at::Tensor>& params, Muon& opt, int from, int to) {
    for (int k = from; k < to; ++k) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[k][i];
      opt.step();
    }
  };

  std::vector<at::Tensor> straight;
  for (const auto& v : init) straight.push_back(leaf(v));
  Muon opt_a(two_groups(straight));
  run(straight, opt_a, 0, 6);

  std::vector<at::Tensor> first;
  for (const auto& v : init) first.push_back(leaf(v));
  Muon opt_b(two_groups(first));
  run(first, opt_b, 0, 3);
  opt_b.param_groups()[0].options().set_lr(0.05);  // unchanged value, via the scheduler API
  const auto bytes = save_to_string(opt_b);

  // A fresh process: new tensors with the saved values, a fresh optimizer
  // with different options that the archive overrides.
  std::vector<at::Tensor> resumed;
  for (const auto& p : first) resumed.push_back(leaf(p));
  std::vector<torch::optim::OptimizerParamGroup> plain_groups;
  plain_groups.emplace_back(std::vector<at::Tensor>{resumed[0], resumed[1]});
  plain_groups.emplace_back(std::vector<at::Tensor>{resumed[2], resumed[3]});
  Muon opt_c(std::move(plain_groups), MuonOptions(1.0));
  load_from_string(opt_c, bytes);
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(static_cast<const MuonOptions&>(opt_c.param_groups()[g].options()),
              static_cast<const MuonOptions&>(opt_b.param_groups()[g].options()));
  }
  EXPECT_EQ(opt_c.state().count(muon::compat::state_key(resumed[3])), 0u);
  EXPECT_TRUE(state_of(opt_c, resumed[0]) == state_of(opt_b, first[0]));
  run(resumed, opt_c, 3, 6);

  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_TRUE(at::equal(resumed[i], straight[i])) << "parameter " << i;
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(state_of(opt_c, resumed[i]) == state_of(opt_a, straight[i])) << "state " << i;
  }
}

TEST(MuonSaveLoad, OptionsRoundTripWithCustomCoefficients) {
  auto o = MuonOptions(0.03)
               .momentum(0.7)
               .weight_decay(0.2)
               .weight_decay_mode("independent")
               .scale_mode("unit_rms_norm")
               .stacked_experts(true)
               .split_sizes({2, 1, 1})
               .num_query_groups(2);
  o.ns().coefficients({{3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}}, muon::StepSchedule::kRepeatLast, 1.01);
  o.ns().steps(7).eps(1e-6).method("standard").symmetric(false);
  torch::serialize::OutputArchive out;
  o.serialize(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  std::istringstream in_bytes(bytes.str());
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  MuonOptions back(0);
  back.serialize(in);
  EXPECT_EQ(back, o);
  EXPECT_FALSE(back == MuonOptions(0.03));
}

TEST(MuonSaveLoad, MismatchedOptimizerIsRejected) {
  auto p = leaf(at::randn({4, 4}));
  Muon opt({p});
  p.mutable_grad() = at::randn({4, 4});
  opt.step();
  const auto bytes = save_to_string(opt);
  auto a = leaf(at::randn({4, 4}));
  auto b = leaf(at::randn({4, 4}));
  Muon two({a, b});
  EXPECT_THROW(load_from_string(two, bytes), c10::ValueError);
  auto c = leaf(at::randn({4, 5}));
  Muon other_shape({c});
  EXPECT_THROW(load_from_string(other_shape, bytes), c10::ValueError);
}

// A variant through the extension points: the update is the plain sign of
// the momentum (no Newton–Schulz), with its own archive kind.
class SignMuon : public Muon {
 public:
  using Muon::Muon;
  int calls = 0;

 protected:
  at::Tensor orthogonal_update(const at::Tensor& /*param*/, const at::Tensor& update,
                               const MuonOptions& /*options*/, MuonParamState& state,
                               double& alpha) override {
    ++calls;
    EXPECT_GE(state.step(), 1);  // counted before the hook runs
    alpha = 0.5;
    return update.sign();
  }
  std::string archive_kind() const override { return "test::SignMuon"; }
};

TEST(MuonExtension, SubclassReplacesTheOrthogonalUpdate) {
  auto p = leaf(at::randn({4, 6}, at::kDouble));
  const auto p0 = p.detach().clone();
  const auto g = at::randn({4, 6}, at::kDouble);
  SignMuon opt({p}, MuonOptions(0.1).nesterov(false).momentum(0.5));
  p.mutable_grad() = g.clone();
  opt.step();
  EXPECT_EQ(opt.calls, 1);
  // ema momentum from zero: buf = 0.5·g; update = sign(buf) scaled by alpha 0.5.
  EXPECT_TRUE(at::equal(p.detach(), p0 - 0.1 * 0.5 * g.sign()));
  // Archives of different kinds do not load into each other.
  const auto bytes = save_to_string(opt);
  auto q = leaf(at::randn({4, 6}, at::kDouble));
  Muon plain({q});
  EXPECT_THROW(load_from_string(plain, bytes), c10::ValueError);
  SignMuon same({q});
  load_from_string(same, bytes);
  EXPECT_EQ(same.state_bytes(), 4 * 6 * 8);
}

TEST(MuonSaveLoad, StateBytesCountMomentumBuffers) {
  auto p = leaf(at::randn({16, 8}));
  auto q = leaf(at::randn({8, 8}).to(at::kBFloat16));
  Muon opt({p, q});
  EXPECT_EQ(opt.state_bytes(), 0);
  p.mutable_grad() = at::randn({16, 8});
  q.mutable_grad() = at::randn({8, 8}).to(at::kBFloat16);
  opt.step();
  EXPECT_EQ(opt.state_bytes(), 16 * 8 * 4 + 8 * 8 * 2);
}

// ---- errors -------------------------------------------------------------------

TEST(MuonErrors, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({4, 4}));
  auto make = [&](MuonOptions o) { return [p, o] { Muon opt({p}, o); }; };
  expect_value_error(make(MuonOptions(-0.1)), {"[muon::Muon]", "lr", "-0.1"});
  expect_value_error(make(MuonOptions().momentum(1.0)), {"[muon::Muon]", "momentum", "[0, 1)", "1"});
  expect_value_error(make(MuonOptions().momentum(-0.5)), {"momentum", "-0.5"});
  expect_value_error(make(MuonOptions().weight_decay(-1e-3)), {"[muon::Muon]", "weight_decay", "-0.001"});
  expect_value_error(make(MuonOptions().extra_scale_factor(0)), {"extra_scale_factor", "0"});
  expect_value_error(make(MuonOptions().num_query_groups(0).split_sizes({4})), {"num_query_groups", "0"});
  expect_value_error(make(MuonOptions().split_sizes({4, 0})), {"split_sizes[1]", "0"});
}

TEST(MuonErrors, InvalidNewtonSchulzOptions) {
  expect_value_error([] { MuonOptions().ns_eps(0.0); }, {"[muon::Muon]", "ns_eps", "0"});
  expect_value_error([] { MuonOptions().ns_eps(-1e-7); }, {"ns_eps", "-1e-07"});
  expect_value_error([] { MuonOptions().ns_steps(0); }, {"[muon::Muon]", "ns_steps", "[1, 100)", "0"});
  expect_value_error([] { MuonOptions().ns_steps(100); }, {"ns_steps", "100"});
  expect_value_error([] { MuonOptions().ns_coefficients("jordan"); },
                     {"[muon::Muon]", "ns_coefficients", "'jordan'", "quintic"});
  expect_value_error([] { MuonOptions().ns_compute_dtype(at::kInt); }, {"ns_compute_dtype", "Int"});
}

TEST(MuonErrors, UnknownModes) {
  expect_value_error([] { MuonOptions().momentum_style("nesterov"); },
                     {"[muon::Muon]", "momentum_style", "'nesterov'", "ema, classic"});
  expect_value_error([] { MuonOptions().weight_decay_mode("l1"); },
                     {"weight_decay_mode", "'l1'", "decoupled, independent, l2"});
  expect_value_error([] { MuonOptions().scale_mode("rms"); }, {"scale_mode", "'rms'", "spectral"});
}

TEST(MuonErrors, BadParameters) {
  expect_value_error([] { Muon opt({leaf(at::randn({8}))}); },
                     {"[muon::Muon]", "shape [8]", "ndim 1", "MuonWithAdamW"});
  expect_value_error([] { Muon opt({leaf(at::randn({0, 4}))}); }, {"[muon::Muon]", "zero size", "[0, 4]"});
  expect_value_error([] { Muon opt({leaf(at::randn({10, 4}))}, MuonOptions().split_sizes({4, 2, 2})); },
                     {"split_sizes", "8 rows", "10 rows"});
}

TEST(MuonErrors, ChecksAgainAtStep) {
  auto p = leaf(at::randn({4, 4}));
  Muon opt({p});
  p.mutable_grad() = at::randn({4, 4});
  opt.param_groups()[0].options().set_lr(-1.0);
  expect_value_error([&] { opt.step(); }, {"lr", "-1"});
  opt.param_groups()[0].options().set_lr(0.02);
  opt.add_param_group(torch::optim::OptimizerParamGroup({leaf(at::randn({3}))}));
  expect_value_error([&] { opt.step(); }, {"ndim 1"});
}

// ---- convergence ----------------------------------------------------------------

TEST(MuonConvergence, LowersTheLossOfASmallNetwork) {
  // A bias-free 2-layer tanh network fits a random teacher of the same shape.
  at::manual_seed(0);
  const auto x = at::randn({256, 16});
  const auto teacher1 = at::randn({16, 32}) / 4.0;
  const auto teacher2 = at::randn({32, 4}) / 5.0;
  const auto y = at::tanh(x.mm(teacher1)).mm(teacher2);
  auto w1 = leaf(at::randn({32, 16}) / 4.0);  // (out, in), as nn::Linear stores it
  auto w2 = leaf(at::randn({4, 32}) / 5.0);
  Muon opt({w1, w2}, MuonOptions(0.02));
  auto loss_fn = [&] { return (at::tanh(x.mm(w1.t())).mm(w2.t()) - y).pow(2).mean(); };
  const double initial = loss_fn().item<double>();
  double last = initial;
  for (int k = 0; k < 150; ++k) {
    last = opt.step([&] {
                opt.zero_grad();
                auto loss = loss_fn();
                loss.backward();
                return loss;
              })
               .item<double>();
  }
  EXPECT_LT(last, 0.1 * initial) << "initial " << initial << " final " << last;
}

}  // namespace
