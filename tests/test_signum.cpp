// Tests of muon::Signum: values against an independent fp64 reference of the
// published update (every weight decay method, Nesterov, bias correction),
// options and their errors, save/load, the registry entry (config fields,
// make_optimizer, explain) and checkpoints resharded across every layout.
// That it trains a model is tests/test_registry.cpp's EveryBuiltin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
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

TEST(Signum, FiveFp32StepsEqualThePublishedUpdate) {
  // 2-D, tall, conv (4-D), stacked experts (3-D) and 1-D parameters, fp32.
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {24, 3}, {4, 3, 3, 3}, {3, 4, 5}, {6}};
  std::vector<std::vector<double>> finals;  // every parameter after 5 steps, per setting
  for (const std::string method : {"decoupled", "independent", "l2"}) {
    for (const bool nesterov : {false, true}) {
      for (const bool correct_bias : {true, false}) {
        const Hyper h{0.01, 0.8, 0.1, method, correct_bias, nesterov};
        ReferenceRun<Reference> reference_run(shapes, 0);
        auto& params = reference_run.params;
        auto& refs = reference_run.refs;
        Signum opt(params, SignumOptions(h.lr)
                               .momentum(h.momentum)
                               .weight_decay(h.wd)
                               .weight_decay_method(method)
                               .correct_bias(correct_bias)
                               .nesterov(nesterov));
        reference_run.run(opt, h, 5);
        const std::string what = method + (nesterov ? " nesterov" : "") +
                                 (correct_bias ? " correct_bias" : "");
        // fp32 against fp64: each step rounds p and m a few times (2^-24
        // relative, O(10) operations per element), far below 1e-5 of the
        // largest value. The sign is exact while its argument stays clear
        // of 0: the seeded run keeps every |u| above 1e-5 of the largest
        // (checked), ~100x the fp32 rounding of m's O(10) operations. A wrong sign,
        // decay or bias correction moves an element by 2·lr = 2e-2.
        for (size_t k = 0; k < params.size(); ++k) {
          ASSERT_GT(refs[k].closest, 1e-5) << what << " param " << k;
          const auto& st =
              static_cast<const SignumParamState&>(*opt.state().at(compat::state_key(params[k])));
          EXPECT_EQ(st.step(), 5);
          EXPECT_LE(relative(params[k], refs[k].p), 1e-5) << what << " param " << k;
          EXPECT_LE(relative(st.exp_avg(), refs[k].m), 1e-5) << what << " exp_avg " << k;
        }
        EXPECT_EQ(opt.state_bytes(), (35 + 72 + 108 + 60 + 6) * 4);
        finals.push_back(reference_run.values());
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
  const SignumOptions o;
  EXPECT_EQ(o.lr(), 1e-3);
  EXPECT_EQ(o.momentum(), 0.9);
  EXPECT_EQ(o.weight_decay(), 0.0);
  EXPECT_EQ(o.weight_decay_method(), "decoupled");
  EXPECT_TRUE(o.correct_bias());
  EXPECT_FALSE(o.nesterov());
}

TEST(Signum, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({3}));
  expect_value_error([&] { Signum opt({p}, SignumOptions(-1)); }, {"[muon::Signum]", "lr", "-1"});
  expect_value_error([&] { Signum opt({p}, SignumOptions().momentum(1.0)); },
                     {"momentum", "[0, 1)", "1"});
  expect_value_error([&] { Signum opt({p}, SignumOptions().momentum(-0.5)); },
                     {"momentum", "-0.5"});
  expect_value_error([&] { Signum opt({p}, SignumOptions().weight_decay(-2)); },
                     {"weight_decay", "-2"});
  expect_value_error([&] { Signum opt({p}, SignumOptions().weight_decay_method("palm")); },
                     {"weight_decay_method", "decoupled, independent, l2", "'palm'"});
  // The config's fields are checked when set.
  OptimizerConfig c;
  expect_value_error([&] { c.set("signum_momentum", 1.0); }, {"signum_momentum", "1"});
  expect_value_error([&] { c.set("signum_weight_decay_method", std::string("palm")); },
                     {"signum_weight_decay_method", "palm"});
}

// Signum in the tests every element-wise optimizer passes (elementwise_cases.h).
struct SignumCase {
  using Optimizer = Signum;
  using Options = SignumOptions;
  using State = SignumParamState;
  using Other = LaProp;
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

MUON_ELEMENTWISE_CASES(Signum, SignumCase)

TEST(Signum, L2DecayLeavesTheCallersGradientUnchanged) {
  elementwise::l2_decay_leaves_the_callers_gradient_unchanged<SignumCase>();
}

}  // namespace
}  // namespace muon::test
