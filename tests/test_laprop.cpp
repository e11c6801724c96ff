// Tests of muon::LaProp: values against an independent fp64 reference of the
// published update, options and their errors, save/load, the registry entry
// (config fields, make_optimizer, explain) and checkpoints resharded across
// layouts. That it trains a model is tests/test_registry.cpp's EveryBuiltin.
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
#include "muon/optim/lion.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace fs = std::filesystem;
namespace ckpt = muon::test::checkpoint;

struct Hyper {
  double lr, beta1, beta2, eps, wd;
  bool correct_bias;
};

// One parameter's plain fp64 run of LaProp as published: the update of
// NVIDIA-NeMo/Emerging-Optimizers, emerging_optimizers/scalar_optimizers/
// update_functions/laprop.py (calculate_laprop_update), with the decoupled
// weight decay its optimizer, emerging_optimizers/scalar_optimizers/laprop.py,
// applies first (WeightDecayMixin, weight_decay_method="decoupled"); the
// paper is Ziyin, Wang and Ueda, "LaProp", arXiv:2002.04839. Written element
// by element on doubles, so that it shares no tensor op with the library.
struct Reference {
  std::vector<double> p, m, v;
  int64_t t = 0;

  explicit Reference(const at::Tensor& init)
      : p(values(init)), m(p.size(), 0.0), v(p.size(), 0.0) {}

  static std::vector<double> values(const at::Tensor& x) {
    const auto d = x.detach().to(at::kDouble).contiguous();
    return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
  }

  void step(const at::Tensor& grad, const Hyper& h) {
    const auto g = values(grad);
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

TEST(LaProp, FiveFp32StepsEqualThePublishedUpdate) {
  // 2-D, tall, conv (4-D) and 1-D parameters, fp32.
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {24, 3}, {4, 3, 3, 3}, {6}};
  for (const bool correct_bias : {true, false}) {
    const Hyper h{0.01, 0.8, 0.95, 1e-8, 0.1, correct_bias};
    at::manual_seed(0);
    std::vector<at::Tensor> params;
    std::vector<Reference> refs;
    for (const auto& s : shapes) {
      params.push_back(leaf(at::randn(s)));
      refs.emplace_back(params.back());
    }
    LaProp opt(params, LaPropOptions(h.lr)
                           .beta1(h.beta1)
                           .beta2(h.beta2)
                           .eps(h.eps)
                           .weight_decay(h.wd)
                           .correct_bias(correct_bias));
    for (int step = 0; step < 5; ++step) {
      for (size_t k = 0; k < params.size(); ++k) {
        const auto g = at::randn(shapes[k]);
        params[k].mutable_grad() = g.clone();
        refs[k].step(g, h);
      }
      opt.step();
    }
    // fp32 against fp64: a few fp32 roundings (2^-24 relative) per step on
    // values of order 1, over 5 steps: far below 1e-5 of the largest. A
    // missing bias correction, decay or normalization moves p by > 1e-3.
    for (size_t k = 0; k < params.size(); ++k) {
      const auto& st =
          static_cast<const LaPropParamState&>(*opt.state().at(compat::state_key(params[k])));
      EXPECT_EQ(st.step(), 5);
      EXPECT_LE(relative(params[k], refs[k].p), 1e-5)
          << "param " << k << " correct_bias " << correct_bias;
      EXPECT_LE(relative(st.exp_avg(), refs[k].m), 1e-5) << "exp_avg " << k;
      EXPECT_LE(relative(st.exp_avg_sq(), refs[k].v), 1e-5) << "exp_avg_sq " << k;
    }
    EXPECT_EQ(opt.state_bytes(), 2 * (35 + 72 + 108 + 6) * 4);
  }
}

TEST(LaProp, DefaultsAreEmergingOptimizers) {
  const LaPropOptions o;
  EXPECT_EQ(o.lr(), 1e-3);
  EXPECT_EQ(o.beta1(), 0.9);
  EXPECT_EQ(o.beta2(), 0.999);
  EXPECT_EQ(o.eps(), 1e-8);
  EXPECT_EQ(o.weight_decay(), 0.0);
  EXPECT_TRUE(o.correct_bias());
}

TEST(LaProp, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({3}));
  expect_value_error([&] { LaProp opt({p}, LaPropOptions(-1)); }, {"[muon::LaProp]", "lr", "-1"});
  expect_value_error([&] { LaProp opt({p}, LaPropOptions().beta1(1.0)); },
                     {"beta1", "[0, 1)", "1"});
  expect_value_error([&] { LaProp opt({p}, LaPropOptions().beta2(-0.1)); }, {"beta2", "-0.1"});
  expect_value_error([&] { LaProp opt({p}, LaPropOptions().eps(-1e-3)); }, {"eps", "-0.001"});
  expect_value_error([&] { LaProp opt({p}, LaPropOptions().weight_decay(-2)); },
                     {"weight_decay", "-2"});
  // A bad edit between steps is caught by the next step, which changes nothing.
  LaProp opt({p});
  opt.param_groups()[0].options().set_lr(-0.5);
  p.mutable_grad() = at::ones({3});
  const auto before = p.detach().clone();
  expect_value_error([&] { opt.step(); }, {"lr", "-0.5"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  // The config's fields are checked when set.
  OptimizerConfig c;
  expect_value_error([&] { c.set("laprop_eps", -1.0); }, {"laprop_eps", "-1"});
  expect_value_error([&] { c.set("laprop_beta1", 1.0); }, {"laprop_beta1", "1"});
}

TEST(LaProp, ResumedRunIsBitIdentical) {
  const auto data = gradient_run(1, {6, 4}, 6);
  const auto options = LaPropOptions(0.01).weight_decay(0.1).beta2(0.9);
  auto a = leaf(data.init);
  LaProp straight({a}, options);
  data.run(a, straight, 0, 6);

  auto b = leaf(data.init);
  LaProp first({b}, options);
  data.run(b, first, 0, 3);
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  LaProp second({c}, LaPropOptions(0.5).correct_bias(false));  // options come from the archive
  load_from_string(second, bytes);
  const auto& o = static_cast<const LaPropOptions&>(second.param_groups()[0].options());
  EXPECT_TRUE(o == options);
  data.run(c, second, 3, 6);
  EXPECT_TRUE(at::equal(a.detach(), c.detach()));
}

TEST(LaProp, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  auto p = leaf(at::randn({3}));
  Lion lion({p});
  p.mutable_grad() = at::ones({3});
  lion.step();
  const auto bytes = save_to_string(lion);
  LaProp opt({p}, LaPropOptions(0.2));
  expect_value_error([&] { load_from_string(opt, bytes); }, {"[muon::LaProp]", "muon::Lion"});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(opt.state().empty());
}

TEST(LaProp, BuiltFromAConfigWithItsFieldsAndExplained) {
  ckpt::Named named;
  named.insert("w", leaf(at::randn({8, 4})));
  named.insert("b", leaf(at::randn({8})));
  OptimizerConfig config;
  apply_config_json(config, R"({"optimizer": "laprop", "lr": 0.01, "laprop_beta2": 0.98,
                                "laprop_correct_bias": false})");
  auto opt = muon::make_optimizer(named, config);
  ASSERT_EQ(opt->num_parts(), 1u);
  EXPECT_EQ(opt->part_name(0), "laprop");
  auto* laprop = dynamic_cast<LaProp*>(opt->find_part("laprop"));
  ASSERT_NE(laprop, nullptr);
  const auto& o = static_cast<const LaPropOptions&>(laprop->param_groups()[0].options());
  EXPECT_EQ(o.lr(), 0.01);
  EXPECT_EQ(o.beta1(), 0.9);
  EXPECT_EQ(o.beta2(), 0.98);
  EXPECT_EQ(o.eps(), 1e-8);
  EXPECT_FALSE(o.correct_bias());
  for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
  opt->step();
  EXPECT_EQ(muon::optimizer_state_bytes(*opt), 2 * (32 + 8) * 4);
  const auto text = muon::explain(named, config);
  EXPECT_NE(text.find("state of laprop: step [counter], exp_avg [param, zeros, rows], "
                      "exp_avg_sq [param, zeros, rows]"),
            std::string::npos)
      << text;
}

// Parameter values of `r`, cloned.
ckpt::Named values_of(ckpt::Rank& r) {
  ckpt::Named out;
  for (const auto& item : r.named) out.insert(item.key(), item.value().detach().clone());
  return out;
}

// A leg of the reshard chain (reshard_leg) with LaProp; with `reference`,
// each rank's part must equal it bit for bit: LaProp is elementwise, so
// every layout computes each element with the same operations on the same
// values, and the state moves with its parameter's rows.
void leg(const std::string& kind, int world, const std::string& in, const std::string& out,
         int64_t from, int64_t to, const ckpt::Named& reference, const std::string& what) {
  ckpt::reshard_leg(kind, world, in, out, from, to, "laprop", what,
                    [&](ckpt::Rank& r, const dist::Group& group) {
                      for (size_t k = 0; k < ckpt::kModel.size() && !reference.is_empty(); ++k) {
                        const auto& name = ckpt::kModel[k].first;
                        EXPECT_TRUE(at::equal(r.named[name].detach(), r.local[k](reference[name])))
                            << what << " " << name << " rank " << group.rank();
                      }
                    });
}

TEST(LaProp, CheckpointsResumeAndReshardBitIdentically) {
  ckpt::Named after3;
  ckpt::Named after4;
  run_ranks(1, [&](dist::Group& g) {
    ckpt::Rank r("none", g, "laprop");
    r.train(0, 3);
    const auto slots = dist::detail::state_slots(*r.opt);
    ASSERT_EQ(slots.size(), ckpt::kModel.size());
    EXPECT_EQ(slots[0].kind, "laprop");
    after3 = values_of(r);
    r.train(3, 4);
    after4 = values_of(r);
  });
  const auto dir =
      fs::temp_directory_path() / ("muon_laprop_reshard_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto d = [&](const char* leg_name) { return (dir / leg_name).string(); };
  // Sharded at 2 ranks → one process → sharded at 3: the moments are split
  // by rows, gathered whole and split again; the step counter travels.
  leg("sharded", 2, "", d("a"), 0, 2, ckpt::Named(), "sharded W=2");
  leg("none", 1, d("a"), d("b"), 2, 3, after3, "single from sharded W=2");
  leg("sharded", 3, d("b"), d("c"), 3, 4, after4, "sharded W=3 from single");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace muon::test
