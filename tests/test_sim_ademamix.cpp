// Tests of muon::SimAdEMAMix: values against an independent fp64 reference
// of the published update (every weight decay method, bias correction, the
// β warmup), options and their errors, save/load, the registry entry
// (config fields, make_optimizer, explain) and checkpoints resharded across
// every layout. That it trains a model is tests/test_registry.cpp's
// EveryBuiltin.
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
#include "muon/optim/signum.h"
#include "muon/optim/sim_ademamix.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

namespace fs = std::filesystem;
namespace ckpt = muon::test::checkpoint;

struct Hyper {
  double lr, beta1, beta2, eps, wd;
  std::string method;
  bool correct_bias;
  int64_t warmup;
  double min_beta, alpha;
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
    auto g = values(grad);
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

TEST(SimAdEMAMix, FiveFp32StepsEqualThePublishedUpdate) {
  // 2-D, tall, conv (4-D), stacked experts (3-D) and 1-D parameters, fp32.
  const std::vector<std::vector<int64_t>> shapes{{5, 7}, {24, 3}, {4, 3, 3, 3}, {3, 4, 5}, {6}};
  std::vector<std::vector<double>> finals;  // every parameter after 5 steps, per setting
  for (const std::string method : {"decoupled", "independent", "l2"}) {
    for (const int64_t warmup : {int64_t{0}, int64_t{4}}) {
      for (const bool correct_bias : {true, false}) {
        const Hyper h{0.01, 0.95, 0.9, 1e-8, 0.1, method, correct_bias, warmup, 0.5, 1.5};
        at::manual_seed(0);
        std::vector<at::Tensor> params;
        std::vector<Reference> refs;
        for (const auto& s : shapes) {
          params.push_back(leaf(at::randn(s)));
          refs.emplace_back(params.back());
        }
        SimAdEMAMix opt(params, SimAdEMAMixOptions(h.lr)
                                    .beta1(h.beta1)
                                    .beta2(h.beta2)
                                    .eps(h.eps)
                                    .weight_decay(h.wd)
                                    .weight_decay_method(method)
                                    .correct_bias(correct_bias)
                                    .num_beta_fast_warmup_steps(warmup)
                                    .min_beta_fast(h.min_beta)
                                    .alpha(h.alpha));
        for (int step = 0; step < 5; ++step) {
          for (size_t k = 0; k < params.size(); ++k) {
            const auto g = at::randn(shapes[k]);
            params[k].mutable_grad() = g.clone();
            refs[k].step(g, h);
          }
          opt.step();
        }
        const std::string what = method + " warmup " + std::to_string(warmup) +
                                 (correct_bias ? " correct_bias" : "");
        // fp32 against fp64: each step rounds p and the moments O(10–20)
        // times per element (2^-24 relative each); the update is a ratio of
        // values of order 1 (|g| / √v̂ is at most a few), so over 5 steps
        // every value stays far below 1e-5 of the largest. A wrong β, decay,
        // α or bias correction moves p by > 1e-3.
        for (size_t k = 0; k < params.size(); ++k) {
          const auto& st = static_cast<const SimAdEMAMixParamState&>(
              *opt.state().at(compat::state_key(params[k])));
          EXPECT_EQ(st.step(), 5);
          EXPECT_LE(relative(params[k], refs[k].p), 1e-5) << what << " param " << k;
          EXPECT_LE(relative(st.exp_avg(), refs[k].m), 1e-5) << what << " exp_avg " << k;
          EXPECT_LE(relative(st.exp_avg_sq(), refs[k].v), 1e-5) << what << " exp_avg_sq " << k;
        }
        EXPECT_EQ(opt.state_bytes(), 2 * (35 + 72 + 108 + 60 + 6) * 4);
        finals.emplace_back();
        for (const auto& r : refs) finals.back().insert(finals.back().end(), r.p.begin(), r.p.end());
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

TEST(SimAdEMAMix, L2DecayLeavesTheCallersGradientUnchanged) {
  auto p = leaf(at::randn({4, 3}));
  SimAdEMAMix opt({p}, SimAdEMAMixOptions(0.01).weight_decay(0.5).weight_decay_method("l2"));
  const auto g = at::randn({4, 3});
  p.mutable_grad() = g.clone();
  opt.step();
  EXPECT_TRUE(at::equal(p.grad(), g));
}

TEST(SimAdEMAMix, DefaultsAreEmergingOptimizers) {
  const SimAdEMAMixOptions o;
  EXPECT_EQ(o.lr(), 1e-3);
  EXPECT_EQ(o.beta1(), 0.9999);
  EXPECT_EQ(o.beta2(), 0.999);
  EXPECT_EQ(o.eps(), 1e-8);
  EXPECT_EQ(o.weight_decay(), 0.0);
  EXPECT_EQ(o.weight_decay_method(), "decoupled");
  EXPECT_TRUE(o.correct_bias());
  EXPECT_EQ(o.num_beta_fast_warmup_steps(), 0);
  EXPECT_EQ(o.min_beta_fast(), 0.9);
  EXPECT_EQ(o.alpha(), 2.0);
}

TEST(SimAdEMAMix, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({3}));
  using O = SimAdEMAMixOptions;
  expect_value_error([&] { SimAdEMAMix opt({p}, O(-1)); }, {"[muon::SimAdEMAMix]", "lr", "-1"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().beta1(1.0)); }, {"beta1", "[0, 1)", "1"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().beta2(-0.1)); }, {"beta2", "-0.1"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().eps(-1e-3)); }, {"eps", "-0.001"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().weight_decay(-2)); }, {"weight_decay", "-2"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().weight_decay_method("palm")); },
                     {"weight_decay_method", "decoupled, independent, l2", "'palm'"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().num_beta_fast_warmup_steps(-3)); },
                     {"num_beta_fast_warmup_steps", "-3"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().min_beta_fast(1.5)); },
                     {"min_beta_fast", "[0, 1)", "1.5"});
  expect_value_error([&] { SimAdEMAMix opt({p}, O().alpha(std::nan(""))); }, {"alpha", "nan"});
  // A bad edit between steps is caught by the next step, which changes nothing.
  SimAdEMAMix opt({p});
  p.mutable_grad() = at::ones({3});
  opt.step();
  const auto& st =
      static_cast<const SimAdEMAMixParamState&>(*opt.state().at(compat::state_key(p)));
  const auto m_before = st.exp_avg().clone();
  const auto v_before = st.exp_avg_sq().clone();
  const auto before = p.detach().clone();
  static_cast<O&>(opt.param_groups()[0].options()).min_beta_fast(-0.25);
  expect_value_error([&] { opt.step(); }, {"min_beta_fast", "-0.25"});
  EXPECT_TRUE(at::equal(p.detach(), before));
  EXPECT_EQ(st.step(), 1);
  EXPECT_TRUE(at::equal(st.exp_avg(), m_before));
  EXPECT_TRUE(at::equal(st.exp_avg_sq(), v_before));
  // The config's fields are checked when set.
  OptimizerConfig c;
  expect_value_error([&] { c.set("sim_ademamix_eps", -1.0); }, {"sim_ademamix_eps", "-1"});
  expect_value_error([&] { c.set("sim_ademamix_beta1", 1.0); }, {"sim_ademamix_beta1", "1"});
  expect_value_error([&] { c.set("sim_ademamix_num_beta_fast_warmup_steps", int64_t{-1}); },
                     {"sim_ademamix_num_beta_fast_warmup_steps", "-1"});
  expect_value_error([&] { c.set("sim_ademamix_weight_decay_method", std::string("palm")); },
                     {"sim_ademamix_weight_decay_method", "palm"});
}

TEST(SimAdEMAMix, ResumedRunIsBitIdentical) {
  const auto data = gradient_run(1, {6, 4}, 6);
  const auto options = SimAdEMAMixOptions(0.01)
                           .weight_decay(0.1)
                           .beta1(0.95)
                           .beta2(0.9)
                           .num_beta_fast_warmup_steps(5)
                           .alpha(1.0)
                           .weight_decay_method("l2");
  auto a = leaf(data.init);
  SimAdEMAMix straight({a}, options);
  data.run(a, straight, 0, 6);

  auto b = leaf(data.init);
  SimAdEMAMix first({b}, options);
  data.run(b, first, 0, 3);
  const auto bytes = save_to_string(first);
  auto c = leaf(b.detach());
  SimAdEMAMix second({c}, SimAdEMAMixOptions(0.5).correct_bias(false));  // options come from the archive
  load_from_string(second, bytes);
  const auto& o = static_cast<const SimAdEMAMixOptions&>(second.param_groups()[0].options());
  EXPECT_TRUE(o == options);
  data.run(c, second, 3, 6);
  EXPECT_TRUE(at::equal(a.detach(), c.detach()));
}

TEST(SimAdEMAMix, LoadRejectsAnotherOptimizersArchiveAndChangesNothing) {
  auto p = leaf(at::randn({3}));
  Signum signum({p});
  p.mutable_grad() = at::ones({3});
  signum.step();
  const auto bytes = save_to_string(signum);
  SimAdEMAMix opt({p}, SimAdEMAMixOptions(0.2));
  expect_value_error([&] { load_from_string(opt, bytes); }, {"[muon::SimAdEMAMix]", "muon::Signum"});
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.2);
  EXPECT_TRUE(opt.state().empty());
}

TEST(SimAdEMAMix, BuiltFromAConfigWithItsFieldsAndExplained) {
  ckpt::Named named;
  named.insert("w", leaf(at::randn({8, 4})));
  named.insert("b", leaf(at::randn({8})));
  OptimizerConfig config;
  apply_config_json(config, R"({"optimizer": "sim_ademamix", "lr": 0.01, "sim_ademamix_beta2": 0.98,
                                "sim_ademamix_num_beta_fast_warmup_steps": 100,
                                "sim_ademamix_alpha": 0.5, "sim_ademamix_correct_bias": false})");
  auto opt = muon::make_optimizer(named, config);
  ASSERT_EQ(opt->num_parts(), 1u);
  EXPECT_EQ(opt->part_name(0), "sim_ademamix");
  auto* sim = dynamic_cast<SimAdEMAMix*>(opt->find_part("sim_ademamix"));
  ASSERT_NE(sim, nullptr);
  const auto& o = static_cast<const SimAdEMAMixOptions&>(sim->param_groups()[0].options());
  EXPECT_EQ(o.lr(), 0.01);
  EXPECT_EQ(o.beta1(), 0.9999);
  EXPECT_EQ(o.beta2(), 0.98);
  EXPECT_EQ(o.num_beta_fast_warmup_steps(), 100);
  EXPECT_EQ(o.min_beta_fast(), 0.9);
  EXPECT_EQ(o.alpha(), 0.5);
  EXPECT_FALSE(o.correct_bias());
  for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
  opt->step();
  EXPECT_EQ(muon::optimizer_state_bytes(*opt), 2 * (32 + 8) * 4);
  const auto text = muon::explain(named, config);
  EXPECT_NE(text.find("state of sim_ademamix: step [counter], exp_avg [param, zeros, rows], "
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

// A leg of the reshard chain (reshard_leg) with SimAdEMAMix; each rank's part
// must equal `reference` bit for bit: SimAdEMAMix is elementwise, so every layout
// computes each element with the same operations on the same values, and
// the state moves with its parameter's rows.
void leg(const std::string& kind, int world, const std::string& in, const std::string& out,
         int64_t from, int64_t to, const ckpt::Named& reference, const std::string& what) {
  ckpt::reshard_leg(kind, world, in, out, from, to, "sim_ademamix", what,
                    [&](ckpt::Rank& r, const dist::Group& group) {
                      for (size_t k = 0; k < ckpt::kModel.size(); ++k) {
                        const auto& name = ckpt::kModel[k].first;
                        EXPECT_TRUE(at::equal(r.named[name].detach(), r.local[k](reference[name])))
                            << what << " " << name << " rank " << group.rank();
                      }
                    });
}

TEST(SimAdEMAMix, EveryLayoutEqualsOneProcessAndCheckpointsReshardBitIdentically) {
  std::vector<ckpt::Named> after(6);  // after[s]: one process after s steps
  run_ranks(1, [&](dist::Group& g) {
    ckpt::Rank r("none", g, "sim_ademamix");
    for (int64_t s = 1; s <= 5; ++s) {
      r.train(s - 1, s);
      after[static_cast<size_t>(s)] = values_of(r);
    }
    EXPECT_EQ(dist::detail::state_slots(*r.opt).at(0).kind, "sim_ademamix");
  });
  const auto dir =
      fs::temp_directory_path() / ("muon_sim_ademamix_reshard_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto d = [&](const char* leg_name) { return (dir / leg_name).string(); };
  // Sharded at 2 ranks → layer-wise at 3 → one process → tensor-parallel at
  // 2 → a (dp 2, tp 2) mesh: the moments are split by rows or columns,
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
