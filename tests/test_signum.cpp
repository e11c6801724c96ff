// Tests of muon::Signum: values against an independent fp64 reference of the
// published update (every weight decay method, Nesterov, bias correction),
// options and their errors, save/load, the registry entry (config fields,
// make_optimizer, explain) and checkpoints resharded across every layout.
// That it trains a model is tests/test_registry.cpp's EveryBuiltin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "elementwise_cases.h"
#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/laprop.h"
#include "muon/optim/signum.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

struct Hyper {
  double lr, momentum, wd;
  std::string method;
  bool correct_bias, nesterov;

  /// The fields in SignumOptions::fields' order.
  auto fields() const { return std::tie(lr, momentum, wd, method, correct_bias, nesterov); }
};

// One parameter's plain fp64 run of Signum as published: NVIDIA-NeMo/
// Emerging-Optimizers' Signum (emerging_optimizers/scalar_optimizers/
// __init__.py at 2472b2eac466a562c20bf4366b2bb7866916c563), whose
// SingleMomentumOptimizer.step (scalar_optimizers/base.py, same commit)
// applies WeightDecayMixin's decay (emerging_optimizers/mixin.py) and then
// calculate_signum_update (scalar_optimizers/update_functions/signum.py at
// b309e2f01cda75dc96a6dc1a2355a7b3b64b5e16); the paper is Bernstein et al.,
// arXiv:1802.04434. Written element by element on doubles, so that it
// shares no tensor op with the library. `closest` is the smallest |u| seen
// relative to the largest: how far the sign's argument stays from 0.
struct Reference {
  std::vector<double> p, m;
  int64_t t = 0;
  double closest = 1e300;

  explicit Reference(const at::Tensor& init) : p(doubles(init)), m(p.size(), 0.0) {}

  /// The moment, as the state's buffer (exp_avg).
  std::vector<const std::vector<double>*> moments() const { return {&m}; }

  void step(const at::Tensor& grad, const Hyper& h) {
    auto g = doubles(grad);
    t += 1;
    const double b = h.momentum;
    const double c1 = h.correct_bias ? 1 - std::pow(b, static_cast<double>(t)) : 1.0;
    const double cn = h.correct_bias ? 1 - std::pow(b, static_cast<double>(t + 1)) : 1.0;
    std::vector<double> u(p.size());
    double largest = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (h.method == "decoupled") p[i] = p[i] - h.wd * h.lr * p[i];
      if (h.method == "independent") p[i] = p[i] - h.wd * p[i];
      if (h.method == "l2") g[i] = g[i] + h.wd * p[i];
      m[i] = b * m[i] + (1 - b) * g[i];
      u[i] = h.nesterov ? b * m[i] / cn + (1 - b) * g[i] / c1 : m[i] / c1;
      largest = std::max(largest, std::abs(u[i]));
    }
    for (size_t i = 0; i < p.size(); ++i) {
      closest = std::min(closest, std::abs(u[i]) / largest);
      const double sign = u[i] > 0 ? 1.0 : u[i] < 0 ? -1.0 : 0.0;
      p[i] = p[i] - h.lr * sign;
    }
  }
};

// Signum in the tests every element-wise optimizer passes (elementwise_cases.h).
struct SignumCase : elementwise::CaseOf<Signum, LaProp> {
  static constexpr const char* kName = "signum";
  static Options resumed() {
    return SignumOptions(0.01).weight_decay(0.1).momentum(0.7).nesterov(true).weight_decay_method(
        "independent");
  }
  static Options replaced() { return SignumOptions(0.5).correct_bias(false); }
  static void bad_edit(Options& o) { o.weight_decay_method("L2"); }
  static std::vector<std::string> bad_edit_words() {
    return {"[muon::Signum]", "weight_decay_method", "'L2'"};
  }
  static constexpr const char* kConfig =
      R"({"optimizer": "signum", "lr": 0.01, "signum_momentum": 0.95, "signum_nesterov": true,
          "signum_weight_decay_method": "l2"})";
  static void check_config(const Options& o) {
    EXPECT_EQ(o.lr(), 0.01);
    EXPECT_EQ(o.momentum(), 0.95);
    EXPECT_TRUE(o.nesterov());
    EXPECT_TRUE(o.correct_bias());
    EXPECT_EQ(o.weight_decay_method(), "l2");
  }
};

TEST(Signum, FiveFp32StepsEqualThePublishedUpdate) {
  // 2-D, tall, conv (4-D), stacked experts (3-D) and 1-D parameters, fp32.
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {24, 3}, {4, 3, 3, 3}, {3, 4, 5}, {6}};
  std::vector<std::vector<double>> finals;  // every parameter after 5 steps, per setting
  for (const std::string method : {"decoupled", "independent", "l2"}) {
    for (const bool nesterov : {false, true}) {
      for (const bool correct_bias : {true, false}) {
        const Hyper h{0.01, 0.8, 0.1, method, correct_bias, nesterov};
        ReferenceRun<Reference> run(shapes, 0);
        const std::string what = method + (nesterov ? " nesterov" : "") +
                                 (correct_bias ? " correct_bias" : "");
        // fp32 against fp64: each step rounds p and m a few times (2^-24
        // relative, O(10) operations per element), far below 1e-5 of the
        // largest value. The sign is exact while its argument stays clear
        // of 0: the seeded run keeps every |u| above 1e-5 of the largest
        // (checked), ~100x the fp32 rounding of m's O(10) operations. A wrong sign,
        // decay or bias correction moves an element by 2·lr = 2e-2.
        const auto bytes =
            elementwise::expect_steps_equal_reference<SignumCase>(run, h, 5, 1e-5, what);
        for (size_t k = 0; k < shapes.size(); ++k)
          ASSERT_GT(run.refs[k].closest, 1e-5) << what << " param " << k;
        EXPECT_EQ(bytes, (35 + 72 + 108 + 60 + 6) * 4);
        finals.push_back(run.values());
      }
    }
  }
  // Each setting changes the result: the reference is not blind to them.
  // Order: method-major, then nesterov, then correct_bias.
  EXPECT_NE(finals[0], finals[4]);  // decoupled vs independent
  EXPECT_NE(finals[0], finals[8]);  // decoupled vs l2
  EXPECT_NE(finals[0], finals[2]);  // nesterov
  EXPECT_NE(finals[2], finals[3]);  // bias correction under nesterov
  EXPECT_EQ(finals[0], finals[1]);  // without nesterov, c(t) > 0 keeps the sign
}

TEST(Signum, DefaultsAreEmergingOptimizers) {
  // lr, momentum, weight_decay, weight_decay_method, correct_bias, nesterov
  elementwise::expect_fields(SignumOptions(), 1e-3, 0.9, 0.0, "decoupled", true, false);
}

TEST(Signum, InvalidOptionsNameArgumentAndValue) {
  using O = SignumOptions;
  elementwise::expect_invalid_options<SignumCase>({{O().momentum(1.0), {"momentum", "[0, 1)", "1"}},
                                                   {O().momentum(-0.5), {"momentum", "-0.5"}},
                                                   {O().weight_decay(-2), {"weight_decay", "-2"}}});
  // The config's fields are checked when set.
  OptimizerConfig c;
  expect_value_error([&] { c.set("signum_momentum", 1.0); }, {"signum_momentum", "1"});
  // weight_decay_method, in the options and in the config.
  elementwise::expect_weight_decay_method_checked<SignumCase>();
}

MUON_ELEMENTWISE_CASES(Signum, SignumCase)
// Options with a weight_decay_method also pass:
MUON_ELEMENTWISE_CASE(Signum, SignumCase, L2DecayLeavesTheCallersGradientUnchanged)

}  // namespace
}  // namespace muon::test
