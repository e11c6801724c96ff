// Tests of muon::LaProp: values against an independent fp64 reference of the
// published update, options and their errors, save/load, the registry entry
// (config fields, make_optimizer, explain) and checkpoints resharded across
// layouts. That it trains a model is tests/test_registry.cpp's EveryBuiltin.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "elementwise_cases.h"
#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/laprop.h"
#include "muon/optim/lion.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

struct Hyper {
  double lr, beta1, beta2, eps, wd;
  bool correct_bias;

  /// The fields in LaPropOptions::fields' order.
  auto fields() const { return std::tie(lr, beta1, beta2, eps, wd, correct_bias); }
};

// One parameter's plain fp64 run of LaProp as published: the update of
// NVIDIA-NeMo/Emerging-Optimizers, emerging_optimizers/scalar_optimizers/
// update_functions/laprop.py (calculate_laprop_update), with the decoupled
// weight decay its optimizer, emerging_optimizers/scalar_optimizers/laprop.py,
// applies first (WeightDecayMixin, weight_decay_method="decoupled"); the
// paper is Ziyin, Wang and Ueda, "LaProp", arXiv:2002.04839. Written element
// by element on doubles, so that it shares no tensor op with the library.
struct Reference : elementwise::TwoMoments {
  using TwoMoments::TwoMoments;

  void step(const at::Tensor& grad, const Hyper& h) {
    const auto g = doubles(grad);
    t += 1;
    const double c1 = h.correct_bias ? 1 - std::pow(h.beta1, static_cast<double>(t)) : 1.0;
    const double c2 = h.correct_bias ? 1 - std::pow(h.beta2, static_cast<double>(t)) : 1.0;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] = p[i] - h.lr * h.wd * p[i];
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * g[i] * g[i];
      const double normalized = g[i] / (std::sqrt(v[i] / c2) + h.eps);
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * normalized;
      p[i] = p[i] - h.lr * (m[i] / c1);
    }
  }
};

// LaProp in the tests every element-wise optimizer passes (elementwise_cases.h).
struct LaPropCase : elementwise::CaseOf<LaProp, Lion> {
  static constexpr const char* kName = "laprop";
  static Options resumed() { return LaPropOptions(0.01).weight_decay(0.1).beta2(0.9); }
  static Options replaced() { return LaPropOptions(0.5).correct_bias(false); }
  static void bad_edit(Options& o) { o.eps(-1e-3); }
  static std::vector<std::string> bad_edit_words() { return {"[muon::LaProp]", "eps", "-0.001"}; }
  static constexpr const char* kConfig =
      R"({"optimizer": "laprop", "lr": 0.01, "laprop_beta2": 0.98, "laprop_correct_bias": false})";
  static void check_config(const Options& o) {
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.beta1(), 0.9);
    EXPECT_EQ(o.beta2(), 0.98);
    EXPECT_EQ(o.eps(), 1e-8);
    EXPECT_FALSE(o.correct_bias());
  }
};

TEST(LaProp, FiveFp32StepsEqualThePublishedUpdate) {
  // 2-D, tall, conv (4-D) and 1-D parameters, fp32.
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {24, 3}, {4, 3, 3, 3}, {6}};
  for (const bool correct_bias : {true, false}) {
    const Hyper h{0.01, 0.8, 0.95, 1e-8, 0.1, correct_bias};
    ReferenceRun<Reference> run(shapes, 0);
    // fp32 against fp64: a few fp32 roundings (2^-24 relative) per step on
    // values of order 1, over 5 steps: far below 1e-5 of the largest. A
    // missing bias correction, decay or normalization moves p by > 1e-3.
    const auto bytes = elementwise::expect_steps_equal_reference<LaPropCase>(
        run, h, 5, 1e-5, correct_bias ? "correct_bias" : "no correct_bias");
    EXPECT_EQ(bytes, 2 * (35 + 72 + 108 + 6) * 4);
  }
}

TEST(LaProp, DefaultsAreEmergingOptimizers) {
  // lr, beta1, beta2, eps, weight_decay, correct_bias
  elementwise::expect_fields(LaPropOptions(), 1e-3, 0.9, 0.999, 1e-8, 0.0, true);
}

TEST(LaProp, InvalidOptionsNameArgumentAndValue) {
  using O = LaPropOptions;
  elementwise::expect_invalid_options<LaPropCase>({{O().beta1(1.0), {"beta1", "[0, 1)", "1"}},
                                                   {O().beta2(-0.1), {"beta2", "-0.1"}},
                                                   {O().eps(-1e-3), {"eps", "-0.001"}},
                                                   {O().weight_decay(-2), {"weight_decay", "-2"}}});
  // The config's fields are checked when set.
  OptimizerConfig c;
  expect_value_error([&] { c.set("laprop_eps", -1.0); }, {"laprop_eps", "-1"});
  expect_value_error([&] { c.set("laprop_beta1", 1.0); }, {"laprop_beta1", "1"});
}

MUON_ELEMENTWISE_CASES(LaProp, LaPropCase)

}  // namespace
}  // namespace muon::test
