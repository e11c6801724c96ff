// Tests of muon::SimAdEMAMix: values against an independent fp64 reference
// of the published update (every weight decay method, bias correction, the
// β warmup), options and their errors, save/load, the registry entry
// (config fields, make_optimizer, explain) and checkpoints resharded across
// every layout. That it trains a model is tests/test_registry.cpp's
// EveryBuiltin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "elementwise_cases.h"
#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/signum.h"
#include "muon/optim/sim_ademamix.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

struct Hyper {
  double lr, beta1, beta2, eps, wd;
  std::string method;
  bool correct_bias;
  int64_t warmup;
  double min_beta, alpha;

  /// The fields in SimAdEMAMixOptions::fields' order.
  auto fields() const {
    return std::tie(lr, beta1, beta2, eps, wd, method, correct_bias, warmup, min_beta, alpha);
  }
};

// β of step t: Emerging-Optimizers' _linear_half_life_warmup_scheduler
// (scalar_optimizers/ademamix.py at f424e8c7af1c29ff4a30baffeb5c4a9c0612b9f6):
// f(b) = ln 0.5 / ln(b + 1e-8) − 1, f⁻¹(s) = 0.5^(1/(s + 1)); for t < N,
// f⁻¹((1 − t/N)·f(start) + (t/N)·f(end)), else end.
double reference_beta(const Hyper& h, int64_t t) {
  if (h.warmup == 0 || t >= h.warmup) return h.beta1;
  const auto f = [](double b) { return std::log(0.5) / std::log(b + 1e-8) - 1; };
  const double a = static_cast<double>(t) / static_cast<double>(h.warmup);
  return std::pow(0.5, 1 / ((1 - a) * f(h.min_beta) + a * f(h.beta1) + 1));
}

// One parameter's plain fp64 run of Simplified AdEMAMix as published:
// NVIDIA-NeMo/Emerging-Optimizers' SimplifiedAdEMAMix (emerging_optimizers/
// scalar_optimizers/__init__.py at 2472b2eac466a562c20bf4366b2bb7866916c563),
// whose TwoMomentsOptimizer.step (scalar_optimizers/base.py, same commit)
// applies WeightDecayMixin's decay (emerging_optimizers/mixin.py) and then
// calculate_sim_ademamix_update (scalar_optimizers/update_functions/
// ademamix.py at ab596e0c89dd69bf46f9a773ae8f1e98c68e2af1); the paper is
// Morwani et al., arXiv:2502.02431. Written element by element on doubles,
// so that it shares no tensor op with the library.
struct Reference : elementwise::TwoMoments {
  using TwoMoments::TwoMoments;

  void step(const at::Tensor& grad, const Hyper& h) {
    auto g = doubles(grad);
    t += 1;
    const double b = reference_beta(h, t);
    const double td = static_cast<double>(t);
    const double c1 = h.correct_bias ? (1 - std::pow(b, td)) / (1 - b) : 1.0;
    const double c2 = h.correct_bias ? 1 - std::pow(h.beta2, td) : 1.0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (h.method == "decoupled") p[i] = p[i] - h.wd * h.lr * p[i];
      if (h.method == "independent") p[i] = p[i] - h.wd * p[i];
      if (h.method == "l2") g[i] = g[i] + h.wd * p[i];
      m[i] = b * m[i] + g[i];
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * g[i] * g[i];
      const double update = (h.alpha * g[i] + m[i] / c1) / (std::sqrt(v[i] / c2) + h.eps);
      p[i] = p[i] - h.lr * update;
    }
  }
};

// SimAdEMAMix in the tests every element-wise optimizer passes (elementwise_cases.h).
struct SimAdEMAMixCase : elementwise::CaseOf<SimAdEMAMix, Signum> {
  static constexpr const char* kName = "sim_ademamix";
  static Options resumed() {
    return SimAdEMAMixOptions(0.01)
        .weight_decay(0.1)
        .beta1(0.95)
        .beta2(0.9)
        .num_beta_fast_warmup_steps(5)
        .alpha(1.0)
        .weight_decay_method("l2");
  }
  static Options replaced() { return SimAdEMAMixOptions(0.5).correct_bias(false); }
  static void bad_edit(Options& o) { o.min_beta_fast(-0.25); }
  static std::vector<std::string> bad_edit_words() {
    return {"[muon::SimAdEMAMix]", "min_beta_fast", "-0.25"};
  }
  static constexpr const char* kConfig =
      R"({"optimizer": "sim_ademamix", "lr": 0.01, "sim_ademamix_beta2": 0.98,
          "sim_ademamix_num_beta_fast_warmup_steps": 100,
          "sim_ademamix_alpha": 0.5, "sim_ademamix_correct_bias": false})";
  static void check_config(const Options& o) {
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.beta1(), 0.9999);
    EXPECT_EQ(o.beta2(), 0.98);
    EXPECT_EQ(o.num_beta_fast_warmup_steps(), 100);
    EXPECT_EQ(o.min_beta_fast(), 0.9);
    EXPECT_EQ(o.alpha(), 0.5);
    EXPECT_FALSE(o.correct_bias());
  }
};

TEST(SimAdEMAMix, FiveFp32StepsEqualThePublishedUpdate) {
  // 2-D, tall, conv (4-D), stacked experts (3-D) and 1-D parameters, fp32.
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {24, 3}, {4, 3, 3, 3}, {3, 4, 5}, {6}};
  std::vector<std::vector<double>> finals;  // every parameter after 5 steps, per setting
  for (const std::string method : {"decoupled", "independent", "l2"}) {
    for (const int64_t warmup : {int64_t{0}, int64_t{4}}) {
      for (const bool correct_bias : {true, false}) {
        const Hyper h{0.01, 0.95, 0.9, 1e-8, 0.1, method, correct_bias, warmup, 0.5, 1.5};
        ReferenceRun<Reference> run(shapes, 0);
        const std::string what = method + " warmup " + std::to_string(warmup) +
                                 (correct_bias ? " correct_bias" : "");
        // fp32 against fp64: each step rounds p and the moments O(10–20)
        // times per element (2^-24 relative each); the update is a ratio of
        // values of order 1 (|g| / √v̂ is at most a few), so over 5 steps
        // every value stays far below 1e-5 of the largest. A wrong β, decay,
        // α or bias correction moves p by > 1e-3.
        const auto bytes =
            elementwise::expect_steps_equal_reference<SimAdEMAMixCase>(run, h, 5, 1e-5, what);
        EXPECT_EQ(bytes, 2 * (35 + 72 + 108 + 60 + 6) * 4);
        finals.push_back(run.values());
      }
    }
  }
  // Each setting changes the result: the reference is not blind to them.
  // Order: method-major, then warmup, then correct_bias.
  EXPECT_NE(finals[0], finals[4]);  // decoupled vs independent
  EXPECT_NE(finals[0], finals[8]);  // decoupled vs l2
  EXPECT_NE(finals[0], finals[2]);  // warmup
  EXPECT_NE(finals[0], finals[1]);  // bias correction
}

TEST(SimAdEMAMix, BetaWarmupFollowsTheHalfLifeSchedule) {
  const auto o = SimAdEMAMixOptions().beta1(0.999).min_beta_fast(0.9).num_beta_fast_warmup_steps(10);
  const Hyper h{1e-3, 0.999, 0.999, 1e-8, 0, "decoupled", true, 10, 0.9, 2};
  double last = 0;
  for (int64_t t = 0; t <= 12; ++t) {
    const double beta = sim_ademamix_beta(o, t);
    EXPECT_NEAR(beta, reference_beta(h, t), 1e-15) << t;
    EXPECT_GE(beta, last) << t;  // rises monotonically
    last = beta;
  }
  // Step 0 maps min_beta_fast through f and back: 0.9 + 1e-8 (f's epsilon,
  // as in Emerging-Optimizers).
  EXPECT_NEAR(sim_ademamix_beta(o, 0), 0.9 + 1e-8, 1e-14);
  EXPECT_EQ(sim_ademamix_beta(o, 10), 0.999);
  // Half-way, the half-life (the exact inverse of f⁻¹, ln ½ / ln β − 1) is
  // the mean of f(0.9) ≈ 5.58 and f(0.999) ≈ 691.8.
  const auto f = [](double b) { return std::log(0.5) / std::log(b + 1e-8) - 1; };
  const auto half_life = [](double b) { return std::log(0.5) / std::log(b) - 1; };
  EXPECT_NEAR(half_life(sim_ademamix_beta(o, 5)), 0.5 * (f(0.9) + f(0.999)), 1e-9 * 350);
  EXPECT_EQ(sim_ademamix_beta(SimAdEMAMixOptions().beta1(0.99), 1), 0.99);  // no warmup
}

TEST(SimAdEMAMix, DefaultsAreEmergingOptimizers) {
  // lr, beta1, beta2, eps, weight_decay, weight_decay_method, correct_bias,
  // num_beta_fast_warmup_steps, min_beta_fast, alpha
  elementwise::expect_fields(SimAdEMAMixOptions(), 1e-3, 0.9999, 0.999, 1e-8, 0.0, "decoupled",
                             true, int64_t{0}, 0.9, 2.0);
}

TEST(SimAdEMAMix, InvalidOptionsNameArgumentAndValue) {
  using O = SimAdEMAMixOptions;
  elementwise::expect_invalid_options<SimAdEMAMixCase>(
      {{O().beta1(1.0), {"beta1", "[0, 1)", "1"}},
       {O().beta2(-0.1), {"beta2", "-0.1"}},
       {O().eps(-1e-3), {"eps", "-0.001"}},
       {O().weight_decay(-2), {"weight_decay", "-2"}},
       {O().num_beta_fast_warmup_steps(-3), {"num_beta_fast_warmup_steps", "-3"}},
       {O().min_beta_fast(1.5), {"min_beta_fast", "[0, 1)", "1.5"}},
       {O().alpha(std::nan("")), {"alpha", "nan"}}});
  // The config's fields are checked when set.
  OptimizerConfig c;
  expect_value_error([&] { c.set("sim_ademamix_eps", -1.0); }, {"sim_ademamix_eps", "-1"});
  expect_value_error([&] { c.set("sim_ademamix_beta1", 1.0); }, {"sim_ademamix_beta1", "1"});
  expect_value_error([&] { c.set("sim_ademamix_num_beta_fast_warmup_steps", int64_t{-1}); },
                     {"sim_ademamix_num_beta_fast_warmup_steps", "-1"});
  // weight_decay_method, in the options and in the config.
  elementwise::expect_weight_decay_method_checked<SimAdEMAMixCase>();
}

MUON_ELEMENTWISE_CASES(SimAdEMAMix, SimAdEMAMixCase)
// Options with a weight_decay_method also pass:
MUON_ELEMENTWISE_CASE(SimAdEMAMix, SimAdEMAMixCase, L2DecayLeavesTheCallersGradientUnchanged)

}  // namespace
}  // namespace muon::test
