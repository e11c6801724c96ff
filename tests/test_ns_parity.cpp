// Parity with the field: the coefficient sets by the names Megatron-Core and
// NVIDIA Emerging-Optimizers (EO) give them, the alias and the renamed
// 5-step set, cubic5, and where the normalization epsilon sits (add: Keller
// Jordan's Muon; clamp: torch.optim.Muon and EO), for muon::newton_schulz and
// for a Muon step on its fused and its tensor-op paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "expect_util.h"
#include "muon/newton_schulz.h"
#include "muon/optim/muon.h"
#include "reference.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

// ---- the sets, as EO writes them ----------------------------------------------

struct FieldSet {
  const char* name;
  bool repeat_last;  // EO: polar_express, cans and deepseekv4 repeat their last tuple
  std::vector<NsCoefficients> tuples;
};

std::vector<FieldSet> eo_sets() {
  const NsCoefficients simple{3.4445, -4.7750, 2.0315};
  std::vector<NsCoefficients> dsv4(8, simple);
  dsv4.push_back({2.0, -1.5, 0.5});
  dsv4.push_back({2.0, -1.5, 0.5});
  return {
      {"simple", false, {simple}},
      {"quintic",
       false,
       {{4.0848, -6.8946, 2.9270},
        {3.9505, -6.3029, 2.6377},
        {3.7418, -5.5913, 2.3037},
        {2.8769, -3.1427, 1.2046},
        {2.8366, -3.0525, 1.2012}}},
      {"polar_express",
       true,
       {{8.2051, -22.9019, 16.4607},
        {4.0664, -2.8612, 0.5184},
        {3.9096, -2.8234, 0.5250},
        {3.2856, -2.4153, 0.4853},
        {2.2779, -1.6198, 0.3985},
        {1.8726, -1.2307, 0.3585},
        {1.8564, -1.2132, 0.3568},
        {1.8750, -1.2500, 0.3750}}},
      {"cans",
       true,
       {{8.4703, -25.1081, 18.6293},
        {4.1828, -3.1087, 0.5806},
        {3.9619, -2.9541, 0.5630},
        {3.2866, -2.4647, 0.5074},
        {2.2737, -1.6447, 0.4162}}},
      {"aol",
       false,
       {{4.0098, -7.0585, 2.4635},
        {3.4585, -5.5479, 2.5959},
        {2.7573, -3.2939, 1.4254},
        {2.7215, -3.0494, 1.3169}}},
      {"deepseekv4", true, dsv4},
      {"cubic5",
       false,
       {{3.3656576, -3.3420992, 0.0},
        {2.5744352, -1.4957376, 0.0},
        {2.5368962, -1.4312570, 0.0},
        {2.4418906, -1.2764040, 0.0},
        {2.2230472, -0.9630650, 0.0}}},
  };
}

TEST(NsParity, SharedNamesHaveTheFieldsTuplesAndSchedule) {
  // Exactly equal: a ported configuration must give the same numbers.
  for (const auto& f : eo_sets()) {
    const auto& set = coefficient_set(f.name);
    EXPECT_EQ(set.name, f.name);
    EXPECT_EQ(set.safety_factor, 1.0) << f.name;  // EO normalizes without a safety factor
    EXPECT_EQ(set.coefficients.size(), f.tuples.size()) << f.name;
    const auto n = static_cast<int64_t>(f.tuples.size());
    for (int64_t k = 0; k < 3 * n + 2; ++k) {
      const auto& want = f.tuples[static_cast<size_t>(f.repeat_last ? std::min(k, n - 1) : k % n)];
      const auto got = set.at_step(k);
      EXPECT_EQ(got.a, want.a) << f.name << " step " << k;
      EXPECT_EQ(got.b, want.b) << f.name << " step " << k;
      EXPECT_EQ(got.c, want.c) << f.name << " step " << k;
    }
  }
  EXPECT_EQ(coefficient_set("polar_express").default_steps, 8);  // the paper's 8 steps
  EXPECT_EQ(coefficient_set("cubic5").default_steps, 5);
  EXPECT_EQ(coefficient_set("quintic").default_steps, 5);
}

TEST(NsParity, FiveStepPolarExpressHasItsOwnName) {
  // modded-nanogpt's / nanochat's set: five tuples, last repeats, safety 1.02.
  const std::vector<NsCoefficients> five = {
      {8.156554524902461, -22.48329292557795, 15.878769915207462},
      {4.042929935166739, -2.808917465908714, 0.5000178451051316},
      {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
      {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
      {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};
  const auto& set = coefficient_set("polar_express_5");
  EXPECT_EQ(set.safety_factor, 1.02);
  EXPECT_EQ(set.default_steps, 5);
  for (int64_t k = 0; k < 8; ++k) {
    const auto& want = five[static_cast<size_t>(std::min<int64_t>(k, 4))];
    EXPECT_EQ(set.at_step(k).a, want.a) << k;
    EXPECT_EQ(set.at_step(k).b, want.b) << k;
    EXPECT_EQ(set.at_step(k).c, want.c) << k;
  }
}

TEST(NsParity, OldEightStepNameIsAnAlias) {
  // polar_express_8 gives the polar_express set itself, under that name: the
  // options compare equal and archive the same.
  EXPECT_EQ(&coefficient_set("polar_express_8"), &coefficient_set("polar_express"));
  EXPECT_TRUE(NewtonSchulzOptions().coefficients("polar_express_8") ==
              NewtonSchulzOptions().coefficients("polar_express"));
  EXPECT_TRUE(MuonOptions().ns_coefficients("polar_express_8") ==
              MuonOptions().ns_coefficients("polar_express"));
  const auto names = coefficient_set_names();
  EXPECT_EQ(names,
            (std::vector<std::string>{"simple", "quintic", "polar_express", "polar_express_5",
                                      "cans", "aol", "deepseekv4", "cubic", "cubic5"}));
  const auto aliases = coefficient_set_aliases();
  ASSERT_EQ(aliases.size(), 1u);
  EXPECT_EQ(aliases[0].first, "polar_express_8");
  EXPECT_EQ(aliases[0].second, "polar_express");
  auto accepted = names;
  accepted.emplace_back("polar_express_8");
  EXPECT_EQ(accepted_coefficient_set_names(), accepted);
  // Errors list every accepted name.
  expect_value_error(
      [] { coefficient_set("polar"); },
      {"[muon::coefficient_set]", "'polar'", "polar_express_5", "cubic5", "polar_express_8"});
  expect_value_error([] { MuonOptions().ns_coefficients("polar"); },
                     {"[muon::Muon]", "ns_coefficients", "'polar'", "polar_express_8"});
}

// ---- cubic5 ----------------------------------------------------------------------

TEST(NsParity, Cubic5TakesTheCubicPathAndMatchesTheFormula) {
  // c = 0 in every tuple: no A² product. The FLOPs the library performs and
  // counts (newton_schulz_flops, the per-thread counter) are those of the
  // cubic step, 5·(s²·l SYRK + 2·s²·l GEMM), with no s³ term.
  const int64_t s = 32, l = 80;
  auto o = NewtonSchulzOptions().coefficients("cubic5").method("standard");
  const double cubic = 5 * (1.0 * s * s * l + 2.0 * s * s * l);
  EXPECT_DOUBLE_EQ(newton_schulz_flops(s, l, o), cubic);
  EXPECT_DOUBLE_EQ(newton_schulz_flops(l, s, o), cubic);
  at::manual_seed(3);
  const auto g = at::randn({s, l});
  reset_newton_schulz_flops_on_this_thread();
  const auto out = newton_schulz(g, o);
  EXPECT_DOUBLE_EQ(newton_schulz_flops_on_this_thread(), cubic);
  // Against the plain formula in fp64: fp32 with a per-step gain ≤ a ≈ 3.4
  // (≈ 120 over five steps at small σ) on 2⁻²⁴ roundoff, ≲ 1e-5 relative.
  const auto ref = reference_newton_schulz(g.to(at::kDouble), o, at::kDouble);
  EXPECT_LE(((out.to(at::kDouble) - ref).norm() / ref.norm()).item<double>(), 2e-5);
}

// ---- where eps sits ---------------------------------------------------------------

// The plain formula in `dtype` with the eps placement of `o`: add is
// X/(‖X‖·s + eps); clamp is X/(‖X‖·s) when ‖X‖·s ≥ eps, else X/eps (the
// shared reference with eps 0, or with safety 0).
at::Tensor plain_ns(const at::Tensor& g, const NewtonSchulzOptions& o,
                    at::ScalarType dtype = at::kDouble) {
  if (o.eps_mode() == NsEpsMode::kAdd) return reference_newton_schulz(g, o, dtype);
  NsTuples tuples;
  for (const auto& k : o.schedule()) tuples.push_back({k.a, k.b, k.c});
  const auto steps = static_cast<int64_t>(tuples.size());
  const double s = o.coefficients().safety_factor;
  const double scaled = g.to(at::kDouble).norm().item<double>() * s;
  return scaled >= o.eps() ? reference_newton_schulz(g, tuples, steps, 0.0, s, dtype)
                           : reference_newton_schulz(g, tuples, steps, o.eps(), 0.0, dtype);
}

double rel(const at::Tensor& x, const at::Tensor& ref) {
  return ((x.to(at::kDouble) - ref.to(at::kDouble)).norm() / ref.to(at::kDouble).norm())
      .item<double>();
}

// A random matrix of shape `shape` with Frobenius norm `norm`.
at::Tensor with_norm(std::vector<int64_t> shape, double norm, uint64_t seed) {
  at::manual_seed(seed);
  const auto g = at::randn(shape, at::kDouble);
  return g * (norm / g.norm().item<double>());
}

NewtonSchulzOptions with_mode(NsEpsMode mode) {
  return NewtonSchulzOptions().eps_mode(mode);  // quintic ×5, eps 1e-7
}

TEST(NsEpsMode, NamesDefaultAndEquality) {
  EXPECT_EQ(NewtonSchulzOptions().eps_mode(), NsEpsMode::kAdd);
  EXPECT_EQ(to_string(NsEpsMode::kClamp), "clamp");
  EXPECT_EQ(parse_ns_eps_mode("add"), NsEpsMode::kAdd);
  EXPECT_EQ(NewtonSchulzOptions().eps_mode("clamp").eps_mode(), NsEpsMode::kClamp);
  EXPECT_FALSE(with_mode(NsEpsMode::kClamp) == with_mode(NsEpsMode::kAdd));
  expect_value_error([] { NewtonSchulzOptions().eps_mode("max"); },
                     {"[muon::NewtonSchulzOptions]", "eps_mode", "'max'", "add, clamp"});
  expect_value_error([] { MuonOptions().ns_eps_mode("max"); },
                     {"[muon::Muon]", "ns_eps_mode", "'max'", "add, clamp"});
}

TEST(NsEpsMode, NewtonSchulzMatchesThePlainFormulaForSmallGradients) {
  // ‖G‖ = 1e-7 and 1e-4 with eps 1e-7: the two placements scale X₀
  // differently by a factor 2 and 1 + 1e-3. Each mode must equal its own
  // formula: fp64 compute to fp64 roundoff amplified by the iteration
  // (1e-12); fp32 compute to 4× the plain fp32 formula's own error plus 8
  // units of fp32 roundoff (the bound of test_newton_schulz), ~1e-6, which
  // is far below the modes' difference (checked below).
  for (const char* set : {"simple", "quintic"}) {
    for (const double norm : {1e-7, 1e-4}) {
      for (const auto& shape : {std::vector<int64_t>{48, 80}, std::vector<int64_t>{80, 48}}) {
        const auto g = with_norm(shape, norm, 17);
        std::vector<at::Tensor> by_mode;
        for (const auto mode : {NsEpsMode::kAdd, NsEpsMode::kClamp}) {
          const auto o = with_mode(mode).coefficients(set);
          const auto ref = plain_ns(g, o);
          const auto o64 = NewtonSchulzOptions(o).compute_dtype(at::kDouble);
          EXPECT_LE(rel(newton_schulz(g, o64), ref), 1e-12) << norm << " " << to_string(mode);
          const auto g32 = g.to(at::kFloat);
          const double tol = 4 * rel(plain_ns(g32, o, at::kFloat), ref) + 8 * std::ldexp(1.0, -24);
          EXPECT_LE(rel(newton_schulz(g32, o), ref), tol) << norm << " " << to_string(mode);
          by_mode.push_back(ref);
        }
        // The test tells the modes apart: with simple (torch.optim.Muon's
        // set) they differ by ~22% and ~1.6e-3, with quintic's flatter map
        // by ~2.7% and ~6.5e-4 on these inputs.
        EXPECT_GE(rel(by_mode[0], by_mode[1]), norm < 1e-6 ? 1e-2 : 4e-4) << set << " " << norm;
      }
    }
  }
}

// One Muon step (μ = 0, no Nesterov, no decay: the update is the gradient's
// orthogonalization) on a parameter made by `make_param` from fp64 values;
// returns Δp relative to the plain formula's Δp = −lr·scale·NS(g).
double muon_step_error(NsEpsMode mode, double norm, at::ScalarType compute,
                       at::Tensor (*make_param)(const at::Tensor&),
                       at::Tensor (*make_grad)(const at::Tensor&, const at::Tensor&)) {
  const std::vector<int64_t> shape = {48, 32};  // tall: shape_scaling √(48/32)
  const auto start = with_norm(shape, 0.02 * std::sqrt(48.0 * 32.0), 5);
  const auto g = with_norm(shape, norm, 6);
  auto p = leaf(make_param(start));
  auto options = MuonOptions(0.02).momentum(0.0).nesterov(false).ns_compute_dtype(compute);
  options.ns().eps_mode(mode);
  Muon opt({p}, options);
  p.mutable_grad() = make_grad(g, p);
  opt.step();
  const auto ref = -0.02 * std::sqrt(48.0 / 32.0) *
                   plain_ns(p.grad().to(at::kDouble), NewtonSchulzOptions().eps_mode(mode));
  return rel(p.detach().to(at::kDouble) - start, ref);
}

at::Tensor fp32_contiguous(const at::Tensor& v) { return v.to(at::kFloat); }
at::Tensor fp32_transposed(const at::Tensor& v) { return v.t().contiguous().t().to(at::kFloat); }
at::Tensor fp64(const at::Tensor& v) { return v.clone(); }
at::Tensor grad_like(const at::Tensor& g, const at::Tensor& p) {
  return at::empty_like(p).copy_(g);  // p's dtype and strides
}

TEST(NsEpsMode, MuonStepOnEveryPathMatchesThePlainFormula) {
  // The fused passes (contiguous fp32 parameter) and the tensor-op step
  // (a non-contiguous fp32 parameter; an fp64 one with fp64 compute) both
  // normalize through the mode. fp32: NS ~1e-6 from fp64 plus the rounding
  // of p + Δp (|p| ≈ 0.02 against |Δp| ≈ 3e-3: 2⁻²⁴·7 ≈ 4e-7 relative);
  // 1e-5 keeps a margin and is far below the modes' difference (≥ 4e-4,
  // the test above).
  // fp64: roundoff only.
  for (const double norm : {1e-7, 1e-4}) {
    for (const auto mode : {NsEpsMode::kAdd, NsEpsMode::kClamp}) {
      const auto what = "|G| " + c10::str(norm) + " " + to_string(mode);
      EXPECT_LE(muon_step_error(mode, norm, at::kFloat, fp32_contiguous, grad_like), 1e-5)
          << "fused " << what;
      EXPECT_LE(muon_step_error(mode, norm, at::kFloat, fp32_transposed, grad_like), 1e-5)
          << "tensor ops " << what;
      EXPECT_LE(muon_step_error(mode, norm, at::kDouble, fp64, grad_like), 1e-10)
          << "fp64 " << what;
    }
  }
}

}  // namespace
}  // namespace muon::test
