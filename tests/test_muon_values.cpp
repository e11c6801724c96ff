// Tests of muon::Muon against the plain reference step (muon_reference.h):
// exact fp64 values over every option combination, fp32 parameters through
// the fused passes and the tensor-op step, shapes (conv, experts, fused QKV),
// coefficient sets and dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "muon/optim/muon.h"
#include "muon_reference.h"
#include "reference.h"

namespace muon::test {
namespace {

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
      for (auto w : {WeightDecayMode::kDecoupled, WeightDecayMode::kIndependent, WeightDecayMode::kL2,
                     WeightDecayMode::kPalm}) {
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
// `library`, when given, replaces the options the library steps with
// (to_muon(o)), for a mode the reference spells differently.
double fp32_error_against_reference(const std::vector<std::vector<int64_t>>& shapes,
                                    const RefOptions& o, bool contiguous,
                                    at::ScalarType compute, int steps = 3,
                                    const MuonOptions* library = nullptr) {
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
  auto options = library != nullptr ? *library : to_muon(o);
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

TEST(MuonOptionsTest, PalmDecayScalesWithLrSquared) {
  // Emerging-Optimizers' palm: p ← p·(1 − lr²·wd). The reference applies
  // that factor as lr-independent decay wd' = lr²·wd; wd = 5 with lr 0.1
  // shrinks p by 5% a step, far above every tolerance below.
  RefOptions o;
  o.lr = 0.1;
  o.wd = 0.1 * 0.1 * 5.0;
  o.wd_mode = WeightDecayMode::kIndependent;
  auto palm = to_muon(o);
  palm.weight_decay(5.0).weight_decay_mode(WeightDecayMode::kPalm);
  // fp64 parameters (tensor-op step).
  at::manual_seed(21);
  auto p = leaf(at::randn({12, 8}, at::kDouble));
  RefParam ref{p.detach().clone(), {}};
  Muon opt({p}, palm);
  for (int k = 0; k < 3; ++k) {
    const auto g = at::randn({12, 8}, at::kDouble);
    p.mutable_grad() = g.clone();
    ref_step(ref, g, o);
    opt.step();
  }
  EXPECT_LT(max_diff(p, ref.p), kFp64Tol);
  // fp32 parameters: the fused passes (contiguous) and the tensor-op step.
  for (const bool contiguous : {true, false}) {
    EXPECT_LT(fp32_error_against_reference({{24, 16}, {16, 40}}, o, contiguous, at::kFloat, 3,
                                           &palm),
              kFp32StepTol)
        << (contiguous ? "fused passes" : "tensor ops");
  }
  // The mode is not decoupled decay (1 − lr·wd would shrink p by 50%).
  auto decoupled = palm;
  decoupled.weight_decay_mode(WeightDecayMode::kDecoupled);
  EXPECT_GT(fp32_error_against_reference({{24, 16}}, o, true, at::kFloat, 3, &decoupled), 1e-2);
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

}  // namespace
}  // namespace muon::test
