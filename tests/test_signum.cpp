// Tests of muon::Signum: values against an independent fp64 reference of the
// published update (every weight decay method, Nesterov, bias correction),
// options and their errors, save/load, the registry entry (config fields,
// make_optimizer, explain) and checkpoints resharded across every layout.
// That it trains a model is tests/test_registry.cpp's EveryBuiltin.
#include <gtest/gtest.h>
#include <unistd.h>

#include "archive_util.h"
#include "expect_util.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_model.h"
#include "dist/checkpoints/checkpoint_state.h"
#include "muon/compat.h"
#include "muon/optim/laprop.h"
#include "muon/optim/signum.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace fs = std::filesystem;
namespace ckpt = muon::test::checkpoint;

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

  explicit Reference(const at::Tensor& init) : p(values(init)), m(p.size(), 0.0) {}

  static std::vector<double> values(const at::Tensor& x) {
    const auto d = x.detach().to(at::kDouble).contiguous();
    return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
  }

  void step(const at::Tensor& grad, const Hyper& h) {
    auto g = values(grad);
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

// Largest |got − want| relative to the largest |want|.
double relative(const at::Tensor& got, const std::vector<double>& want) {
  const auto g = Reference::values(got);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(g[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

TEST(Signum, FiveFp32StepsEqualThePublishedUpdate) {
  // 2-D, tall, conv (4-D), stacked experts (3-D) and 1-D parameters, fp32.
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {24, 3}, {4, 3, 3, 3}, {3, 4, 5}, {6}};
  std::vector<std::vector<double>> finals;  // every parameter after 5 steps, per setting
  for (const std::string method : {"decoupled", "independent", "l2"}) {
    for (const bool nesterov : {false, true}) {
      for (const bool correct_bias : {true, false}) {
        const Hyper h{0.01, 0.8, 0.1, method, correct_bias, nesterov};
        at::manual_seed(0);
        std::vector<at::Tensor> params;
        std::vector<Reference> refs;
        for (const auto& s : shapes) {
          params.push_back(leaf(at::randn(s)));
          refs.emplace_back(params.back());
        }
        Signum opt(params, SignumOptions(h.lr)
                               .momentum(h.momentum)
                               .weight_decay(h.wd)
                               .weight_decay_method(method)
                               .correct_bias(correct_bias)
                               .nesterov(nesterov));
        for (int step = 0; step < 5; ++step) {
          for (size_t k = 0; k < params.size(); ++k) {
            const auto g = at::randn(shapes[k]);
            params[k].mutable_grad() = g.clone();
            refs[k].step(g, h);
          }
          opt.step();
        }
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
        finals.emplace_back();
        for (const auto& r : refs) finals.back().insert(finals.back().end(), r.p.begin(), r.p.end());
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

TEST(Signum, L2DecayLeavesTheCallersGradientUnchanged) {
  auto p = leaf(at::randn({4, 3}));
  Signum opt({p}, SignumOptions(0.01).weight_decay(0.5).weight_decay_method("l2"));
  const auto g = at::randn({4, 3});
  p.mutable_grad() = g.clone();
  opt.step();
  EXPECT_TRUE(at::equal(p.grad(), g));
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
  // A bad edit between steps is caught by the next step, which changes nothing.
  Signum opt({p});
  p.mutable_grad() = at::ones({3});
  opt.step();
  const auto state_before =
      static_cast<const SignumParamState&>(*opt.state().at(compat::state_key(p))).exp_avg().clone();
  static_cast<SignumOptions&>(opt.param_groups()[0].options()).weight_decay_method("L2");
  const auto before = p.detach().clone();
  expect_value_error([&] { opt.step(); }, {"weight_decay_method", "'L2'"});
  static_cast<SignumOptions&>(opt.param_groups()[0].options()).weight_decay_method("l2");
  opt.param_groups()[0].options().set_lr(-0.5);
  expect_value_error([&] { opt.step(); }, {"lr", "-0.5"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  const auto& st = static_cast<const SignumParamState&>(*opt.state().at(compat::state_key(p)));
  EXPECT_EQ(st.step(), 1);
  EXPECT_TRUE(at::equal(st.exp_avg(), state_before));
  // The config's fields are checked when set.
  OptimizerConfig c;
  expect_value_error([&] { c.set("signum_momentum", 1.0); }, {"signum_momentum", "1"});
  expect_value_error([&] { c.set("signum_weight_decay_method", std::string("palm")); },
                     {"signum_weight_decay_method", "palm"});
}

TEST(Signum, ResumedRunIsBitIdentical) {
  const auto data = gradient_run(1, {6, 4}, 6);
  const auto options =
      SignumOptions(0.01).weight_decay(0.1).momentum(0.7).nesterov(true).weight_decay_method(
          "independent");
  auto a = leaf(data.init);
  Signum straight({a}, options);
  data.run(a, straight, 0, 6);

  auto b = leaf(data.init);
  Signum first({b}, options);
  data.run(b, first, 0, 3);
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  Signum second({c}, SignumOptions(0.5).correct_bias(false));  // options come from the archive
  load_from_string(second, bytes);
  const auto& o = static_cast<const SignumOptions&>(second.param_groups()[0].options());
  EXPECT_TRUE(o == options);
  data.run(c, second, 3, 6);
  EXPECT_TRUE(at::equal(a.detach(), c.detach()));
}

TEST(Signum, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  auto p = leaf(at::randn({3}));
  LaProp laprop({p});
  p.mutable_grad() = at::ones({3});
  laprop.step();
  const auto bytes = save_to_string(laprop);
  Signum opt({p}, SignumOptions(0.2));
  expect_value_error([&] { load_from_string(opt, bytes); }, {"[muon::Signum]", "muon::LaProp"});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(opt.state().empty());
}

TEST(Signum, BuiltFromAConfigWithItsFieldsAndExplained) {
  ckpt::Named named;
  named.insert("w", leaf(at::randn({8, 4})));
  named.insert("b", leaf(at::randn({8})));
  OptimizerConfig config;
  apply_config_json(config, R"({"optimizer": "signum", "lr": 0.01, "signum_momentum": 0.95,
                                "signum_nesterov": true, "signum_weight_decay_method": "l2"})");
  auto opt = muon::make_optimizer(named, config);
  ASSERT_EQ(opt->num_parts(), 1u);
  EXPECT_EQ(opt->part_name(0), "signum");
  auto* signum = dynamic_cast<Signum*>(opt->find_part("signum"));
  ASSERT_NE(signum, nullptr);
  const auto& o = static_cast<const SignumOptions&>(signum->param_groups()[0].options());
  EXPECT_EQ(o.lr(), 0.01);
  EXPECT_EQ(o.momentum(), 0.95);
  EXPECT_TRUE(o.nesterov());
  EXPECT_TRUE(o.correct_bias());
  EXPECT_EQ(o.weight_decay_method(), "l2");
  for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
  opt->step();
  EXPECT_EQ(muon::optimizer_state_bytes(*opt), (32 + 8) * 4);
  const auto text = muon::explain(named, config);
  EXPECT_NE(text.find("state of signum: step [counter], exp_avg [param, zeros, rows]"),
            std::string::npos)
      << text;
}

// Parameter values of `r`, cloned.
ckpt::Named values_of(ckpt::Rank& r) {
  ckpt::Named out;
  for (const auto& item : r.named) out.insert(item.key(), item.value().detach().clone());
  return out;
}

// A leg of the reshard chain (reshard_leg) with Signum; each rank's part
// must equal `reference` bit for bit: Signum is elementwise, so every layout
// computes each element with the same operations on the same values, and
// the state moves with its parameter's rows.
void leg(const std::string& kind, int world, const std::string& in, const std::string& out,
         int64_t from, int64_t to, const ckpt::Named& reference, const std::string& what) {
  ckpt::reshard_leg(kind, world, in, out, from, to, "signum", what,
                    [&](ckpt::Rank& r, const dist::Group& group) {
                      for (size_t k = 0; k < ckpt::kModel.size(); ++k) {
                        const auto& name = ckpt::kModel[k].first;
                        EXPECT_TRUE(at::equal(r.named[name].detach(), r.local[k](reference[name])))
                            << what << " " << name << " rank " << group.rank();
                      }
                    });
}

TEST(Signum, EveryLayoutEqualsOneProcessAndCheckpointsReshardBitIdentically) {
  std::vector<ckpt::Named> after(6);  // after[s]: one process after s steps
  run_ranks(1, [&](dist::Group& g) {
    ckpt::Rank r("none", g, "signum");
    for (int64_t s = 1; s <= 5; ++s) {
      r.train(s - 1, s);
      after[static_cast<size_t>(s)] = values_of(r);
    }
    EXPECT_EQ(dist::detail::state_slots(*r.opt).at(0).kind, "signum");
  });
  const auto dir =
      fs::temp_directory_path() / ("muon_signum_reshard_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto d = [&](const char* leg_name) { return (dir / leg_name).string(); };
  // Sharded at 2 ranks → layer-wise at 3 → one process → tensor-parallel at
  // 2 → a (dp 2, tp 2) mesh: the momentum is split by rows or columns,
  // gathered whole and split again; the step counter travels.
  leg("sharded", 2, "", d("a"), 0, 1, after[1], "sharded W=2");
  leg("layerwise", 3, d("a"), d("b"), 1, 2, after[2], "layer-wise W=3 from sharded W=2");
  leg("none", 1, d("b"), d("c"), 2, 3, after[3], "single from layer-wise W=3");
  leg("tp", 2, d("c"), d("e"), 3, 4, after[4], "tensor-parallel W=2 from single");
  leg("2d", 4, d("e"), d("f"), 4, 5, after[5], "dp x tp 2x2 from tensor-parallel W=2");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace muon::test
