// The checks before a step (muon/optim/step_guard.h): non-finite gradients
// under each policy, in one process and agreed across ranks; huge gradients;
// parameters and gradients a step cannot take; all-or-nothing option edits;
// load errors that say what the archive holds.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dist_util.h"
#include "expect_util.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/muon.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/lion.h"
#include "muon/optim/step_guard.h"
#include "muon/registry.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

using Named = torch::OrderedDict<std::string, at::Tensor>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Bit-exact copies of tensors, to show that nothing changed.
std::vector<at::Tensor> snapshot(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

void expect_unchanged(const std::vector<at::Tensor>& now, const std::vector<at::Tensor>& before) {
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_TRUE(at::equal(now[i].detach(), before[i])) << "tensor " << i << " changed";
  }
}

bool all_finite(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (!at::isfinite(t.detach()).all().item<bool>()) return false;
  }
  return true;
}

// The serialized state of `opt`: equal bytes mean equal state.
std::string archive_bytes(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive a;
  opt.save(a);
  std::ostringstream out;
  a.save_to(out);
  return out.str();
}

// Two matrices and a vector, seeded; gradients for step `s`.
struct Model {
  std::vector<at::Tensor> params{leaf(seeded_randn({16, 8}, 1)), leaf(seeded_randn({8, 8}, 2))};
  void grads(int64_t s, double poison = 0, size_t which = 1) {
    for (size_t k = 0; k < params.size(); ++k) {
      params[k].mutable_grad() = seeded_randn(params[k].sizes().vec(), 100 + 10 * s + k);
    }
    if (poison != 0) params[which].mutable_grad()[3][5] = poison;
  }
};

// Steps a fresh `make()` optimizer through steps 0..2 with a non-finite
// gradient at step 1 under `policy`; returns what happened.
template <typename Make>
void check_policies(const Make& make, const std::string& who) {
  for (const double poison : {kNaN, kInf, -kInf}) {
    // error: raises naming the parameter; parameters and state as before the step.
    {
      Model m;
      auto opt = make(m.params);
      m.grads(0);
      opt->step();
      const auto params = snapshot(m.params);
      const auto state = archive_bytes(*opt);
      m.grads(1, poison);
      expect_value_error([&] { opt->step(); },
                         {who, "parameter 1 of group 0 (shape [8, 8])", "non-finite gradient"});
      expect_unchanged(m.params, params);
      EXPECT_TRUE(archive_bytes(*opt) == state) << who << ": state changed by a refused step";
    }
    // skip_step: skipped and counted; the run continues as if the step never came.
    {
      Model m;
      Model ref;
      auto opt = make(m.params);
      auto ref_opt = make(ref.params);
      dynamic_cast<StepGuard&>(*opt).set_nonfinite(NonFinitePolicy::kSkipStep);
      m.grads(0);
      ref.grads(0);
      opt->step();
      ref_opt->step();
      m.grads(1, poison);
      opt->step();
      EXPECT_EQ(dynamic_cast<StepGuard&>(*opt).skipped_steps(), 1);
      m.grads(2);
      ref.grads(2);
      opt->step();
      ref_opt->step();
      // Equal parameters two steps on: the state is as if step 1 never came.
      m.grads(3);
      ref.grads(3);
      opt->step();
      ref_opt->step();
      for (size_t k = 0; k < m.params.size(); ++k) {
        EXPECT_TRUE(at::equal(m.params[k].detach(), ref.params[k].detach())) << who << " param " << k;
      }
    }
    // propagate: no check, the step is applied with the value in it
    // (torch.optim's behaviour): Muon's matrix turns non-finite; Lion's
    // sign() turns NaN into 0, so its element only stops moving.
    {
      Model m;
      auto opt = make(m.params);
      dynamic_cast<StepGuard&>(*opt).set_nonfinite(NonFinitePolicy::kPropagate);
      const auto before = snapshot(m.params);
      m.grads(1, poison);
      opt->step();
      EXPECT_FALSE(at::equal(m.params[0].detach(), before[0])) << who << ": the step was not applied";
      if (who != "[muon::Lion]") {
        EXPECT_FALSE(all_finite({m.params[1]})) << who;
      }
    }
  }
}

TEST(NonFinite, MuonFusedAndUnfusedPaths) {
  check_policies([](const std::vector<at::Tensor>& p) { return std::make_unique<Muon>(p); },
                 "[muon::Muon]");
  // bf16 compute with l2 decay: the unfused path.
  check_policies(
      [](const std::vector<at::Tensor>& p) {
        return std::make_unique<Muon>(
            p, MuonOptions().weight_decay(0.1).weight_decay_mode("l2").ns_compute_dtype(at::kBFloat16));
      },
      "[muon::Muon]");
}

TEST(NonFinite, AdaptiveMuonAndLion) {
  check_policies(
      [](const std::vector<at::Tensor>& p) {
        return std::make_unique<AdaptiveMuon>(p, MuonOptions(), AdaptiveMuonOptions());
      },
      "[muon::Muon]");
  check_policies([](const std::vector<at::Tensor>& p) { return std::make_unique<Lion>(p); },
                 "[muon::Lion]");
}

TEST(NonFinite, HybridNamesTheParameterAndTouchesNoPart) {
  Named named;
  named.insert("w", leaf(seeded_randn({16, 8}, 1)));
  named.insert("b", leaf(seeded_randn({8}, 2)));
  MuonWithAdamW opt(named);
  for (const auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
  opt.step();
  const auto before = snapshot({named["w"], named["b"]});
  const auto state = archive_bytes(opt);
  named["w"].mutable_grad() = at::ones_like(named["w"]);
  named["b"].mutable_grad() = at::full({8}, kNaN);  // AdamW's parameter
  expect_value_error([&] { opt.step(); }, {"parameter 'b' (shape [8])", "non-finite"});
  expect_unchanged({named["w"], named["b"]}, before);  // Muon's half untouched too
  EXPECT_TRUE(archive_bytes(opt) == state);
  opt.set_nonfinite(NonFinitePolicy::kSkipStep);
  opt.step();
  EXPECT_EQ(opt.skipped_steps(), 1);
  expect_unchanged({named["w"], named["b"]}, before);
}

// Sharded Muon over 2 ranks: a NaN on rank 1 only. Every rank skips (or
// raises) together; without the agreement rank 0 would step alone.
TEST(NonFinite, ShardedRanksAgree) {
  for (const auto policy : {NonFinitePolicy::kSkipStep, NonFinitePolicy::kError}) {
    const auto errors = run_ranks_collect(2, [&](distributed::Group& group) {
      auto p = leaf(seeded_randn({4, 8}, 7 + group.rank()));
      distributed::ShardedMuon opt({p}, {distributed::RowShard({8, 8}, group)});
      opt.set_nonfinite(policy);
      p.mutable_grad() = seeded_randn({4, 8}, 20 + group.rank());
      opt.step();
      const auto before = p.detach().clone();
      p.mutable_grad() = seeded_randn({4, 8}, 30 + group.rank());
      if (group.rank() == 1) p.mutable_grad()[0][0] = kNaN;
      opt.step();  // raises under kError
      EXPECT_EQ(opt.skipped_steps(), 1);
      EXPECT_TRUE(at::equal(p.detach(), before)) << "rank " << group.rank() << " stepped";
      p.mutable_grad() = seeded_randn({4, 8}, 40 + group.rank());
      opt.step();  // and the ranks still step together afterwards
      EXPECT_FALSE(at::equal(p.detach(), before));
    });
    if (policy == NonFinitePolicy::kSkipStep) {
      EXPECT_EQ(errors[0], "");
      EXPECT_EQ(errors[1], "");
    } else {
      EXPECT_NE(errors[0].find("rank 1 has a non-finite gradient"), std::string::npos) << errors[0];
      EXPECT_NE(errors[1].find("parameter 0 of group 0 (shape [4, 8]) has a non-finite"),
                std::string::npos)
          << errors[1];
    }
  }
}

// Layer-wise over 2 ranks: rank 1 owns a parameter whose gradient is NaN;
// both ranks skip, and rank 0's owned parameters are not updated either.
TEST(NonFinite, LayerwiseRanksAgree) {
  const auto errors = run_ranks_collect(2, [&](distributed::Group& group) {
    Named named;
    for (int k = 0; k < 4; ++k) named.insert("w" + std::to_string(k), leaf(seeded_randn({8, 8}, k)));
    distributed::LayerwiseOptimizer opt(named, group, [](const Named& owned) {
      return std::make_unique<MuonWithAdamW>(owned);
    });
    opt.set_nonfinite(NonFinitePolicy::kSkipStep);
    const auto before = snapshot(named.values());
    for (int k = 0; k < 4; ++k) named[("w" + std::to_string(k))].mutable_grad() = seeded_randn({8, 8}, 50 + k);
    // Poison, on every rank, a gradient that rank 1 owns (the gradients of
    // replicated parameters are equal on every rank after their all-reduce).
    for (size_t i = 0; i < opt.owners().size(); ++i) {
      if (opt.owners()[i] == 1) {
        named[opt.names()[i]].mutable_grad()[1][1] = kInf;
        break;
      }
    }
    opt.step();
    EXPECT_EQ(opt.skipped_steps(), 1);
    expect_unchanged(named.values(), before);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Gradients of 1e19–1e38: Σg² overflows fp32. The update must equal the one
// for the same gradient scaled down by a power of two (exact in fp32), up
// to the rounding of the norm: the two sums of squares are computed in
// different precisions (fp32 blocks vs fp64), so X₀ differs by a few ulps
// (≲ 1e-6 relative) and Newton–Schulz maps that to ≲ 1e-5 of the update's
// largest element; the update without the fix is zero.
TEST(HugeGradients, UpdateEqualsTheRescaledInput) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const double big : {std::ldexp(1.0, 66), std::ldexp(1.0, 100), std::ldexp(1.0, 125)}) {
      const auto g = seeded_randn({32, 16}, 3);
      auto small = leaf(at::zeros({32, 16}));
      auto huge = leaf(at::zeros({32, 16}));
      Muon a({small}, MuonOptions(1.0).ns_compute_dtype(dtype));
      Muon b({huge}, MuonOptions(1.0).ns_compute_dtype(dtype));
      small.mutable_grad() = g;
      huge.mutable_grad() = g * big;
      a.step();
      b.step();
      ASSERT_TRUE(all_finite({huge})) << big;
      const double scale = small.detach().abs().max().item<double>();
      EXPECT_GT(scale, 0.1);
      const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;  // bf16: an ulp of bf16 is 2^-8
      EXPECT_LE((huge.detach() - small.detach()).abs().max().item<double>(), tol * scale)
          << "dtype " << dtype << " scale " << big;
    }
  }
  // newton_schulz itself, on a non-contiguous input (not the fused path).
  const auto x = seeded_randn({16, 32}, 4).t();
  const auto ref = newton_schulz(x);
  const auto out = newton_schulz(x * std::ldexp(1.0, 110));
  EXPECT_LE((out - ref).abs().max().item<double>(), 1e-5);
}

TEST(Steppable, ParametersRefusedAtConstruction) {
  auto half = leaf(at::zeros({4, 4}, at::kHalf));
  expect_value_error([&] { Muon({half}); }, {"[muon::Muon]", "float16 on CPU", "parameter 0"});
  expect_value_error([&] { Lion({half}); }, {"[muon::Lion]", "float16 on CPU"});
  Named named;
  named.insert("h", half);
  expect_value_error([&] { MuonWithAdamW m(named); }, {"float16 on CPU"});
  auto expanded = at::zeros({1, 4}).expand({4, 4});
  expect_value_error([&] { Muon({expanded}); }, {"share memory", "strides [0, 1]"});
  auto w = leaf(at::zeros({4, 4}));
  using Group = torch::optim::OptimizerParamGroup;
  expect_value_error([&] { Muon(std::vector<Group>{Group({w}), Group({w})}); },
                     {"some parameters appear in more than one parameter group"});
  expect_value_error([&] { Lion(std::vector<at::Tensor>{w, w}); },
                     {"some parameters appear in more than one parameter group"});
  // Added after construction: refused at the next step, before anything changes.
  Muon opt({w});
  opt.add_param_group(Group({w}));
  w.mutable_grad() = at::ones_like(w);
  expect_value_error([&] { opt.step(); }, {"more than one parameter group"});
  EXPECT_TRUE(at::equal(w.detach(), at::zeros({4, 4})));
}

TEST(Steppable, GradientMustMatchItsParameter) {
  auto w = leaf(seeded_randn({4, 6}, 1));
  Muon opt({w});
  const auto before = w.detach().clone();
  w.mutable_grad() = at::ones({1, 6});  // broadcastable, still wrong
  expect_value_error([&] { opt.step(); }, {"gradient of parameter 0 of group 0", "shape [1, 6]"});
  w.mutable_grad() = at::ones({4, 6}, at::kDouble);
  expect_value_error([&] { opt.step(); }, {"dtype Double", "dtype Float"});
  EXPECT_TRUE(at::equal(w.detach(), before));
  EXPECT_TRUE(archive_bytes(opt) == archive_bytes(Muon({leaf(before)})));  // no state created
}

// An edit that makes a later group invalid must stop the whole step.
TEST(AllOrNothing, EveryGroupValidatedBeforeAnyIsStepped) {
  using Group = torch::optim::OptimizerParamGroup;
  auto a = leaf(seeded_randn({4, 4}, 1));
  auto b = leaf(seeded_randn({4, 4}, 2));
  Lion lion(std::vector<Group>{Group({a}), Group({b})});
  static_cast<LionOptions&>(lion.param_groups()[1].options()).lr(-1);
  a.mutable_grad() = at::ones_like(a);
  b.mutable_grad() = at::ones_like(b);
  const auto before = snapshot({a, b});
  expect_value_error([&] { lion.step(); }, {"[muon::Lion]", "lr"});
  expect_unchanged({a, b}, before);

  // The hybrid: an invalid AdamW lr stops Muon's half too.
  Named named;
  named.insert("w", leaf(seeded_randn({8, 4}, 3)));
  named.insert("b", leaf(seeded_randn({4}, 4)));
  MuonWithAdamW opt(named);
  for (auto& g : opt.param_groups()) {
    if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&g.options())) o->lr(-0.5);
  }
  for (const auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
  const auto hybrid_before = snapshot(named.values());
  expect_value_error([&] { opt.step(); }, {"lr of group", "-0.5"});
  expect_unchanged(named.values(), hybrid_before);
}

TEST(LoadErrors, SayWhatTheArchiveHolds) {
  Named named;
  named.insert("w", leaf(seeded_randn({8, 4}, 3)));
  named.insert("b", leaf(seeded_randn({4}, 4)));
  MuonWithAdamW hybrid(named);
  torch::serialize::OutputArchive out;
  hybrid.save(out);
  std::stringstream bytes;
  out.save_to(bytes);

  // A hybrid's archive into Muon alone.
  Muon muon({named["w"]});
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  expect_value_error([&] { muon.load(in); },
                     {"holds the state of a muon::CompositeOptimizer of 2 parts ('muon', 'adamw')",
                      "this optimizer is muon::Muon"});

  // A composite of one part (no vector parameters) from the two-part archive.
  Named only_matrix;
  only_matrix.insert("w", named["w"]);
  MuonWithAdamW one(only_matrix);
  bytes.seekg(0);
  torch::serialize::InputArchive in2;
  in2.load_from(bytes);
  expect_value_error([&] { one.load(in2); }, {"2 parts ('muon', 'adamw')", "1 part ('muon')"});

  // A layer-wise rank's archive (as a 2-rank checkpoint) into one process.
  std::stringstream layerwise_bytes;
  run_ranks(2, [&](distributed::Group& group) {
    Named replica;
    replica.insert("w", leaf(seeded_randn({8, 4}, 3)));
    replica.insert("v", leaf(seeded_randn({8, 4}, 5)));
    distributed::LayerwiseOptimizer lw(replica, group, [](const Named& owned) {
      return std::make_unique<MuonWithAdamW>(owned);
    });
    torch::serialize::OutputArchive a;
    lw.save(a);
    if (group.rank() == 0) a.save_to(layerwise_bytes);
  });
  torch::serialize::InputArchive in3;
  in3.load_from(layerwise_bytes);
  expect_value_error([&] { hybrid.load(in3); },
                     {"muon::distributed::LayerwiseOptimizer written by rank 0 of 2 ranks",
                      "same layout and world size"});
}

// The config key `nonfinite` reaches the optimizer make_optimizer builds.
TEST(NonFinite, FromTheConfig) {
  Named named;
  named.insert("w", leaf(seeded_randn({8, 4}, 3)));
  named.insert("b", leaf(seeded_randn({4}, 4)));
  OptimizerConfig config;
  EXPECT_EQ(config.get_string("nonfinite"), "error");
  config.set("nonfinite", "skip_step");
  auto opt = make_optimizer(named, config);
  EXPECT_EQ(opt->nonfinite(), NonFinitePolicy::kSkipStep);
  const auto before = snapshot(named.values());
  named["w"].mutable_grad() = at::full({8, 4}, kNaN);
  named["b"].mutable_grad() = at::ones({4});
  opt->step();
  EXPECT_EQ(opt->skipped_steps(), 1);
  expect_unchanged(named.values(), before);
  expect_value_error([&] { config.set("nonfinite", "ignore"); }, {"nonfinite", "ignore"});
}

TEST(NonFinite, PolicyNames) {
  for (const auto& name : nonfinite_policy_names()) {
    EXPECT_EQ(to_string(parse_nonfinite_policy(name)), name);
  }
  expect_value_error([] { parse_nonfinite_policy("ignore"); },
                     {"ignore", "error, skip_step, propagate"});
  EXPECT_TRUE(detail::all_finite(at::ones({3, 3}, at::kBFloat16)));
  EXPECT_FALSE(detail::all_finite(at::full({70000}, kInf, at::kDouble)));
  EXPECT_FALSE(detail::all_finite(at::full({2}, kNaN, at::kHalf)));
  EXPECT_FALSE(detail::all_finite(at::full({5, 4}, kNaN).t()));  // not contiguous
}

}  // namespace
}  // namespace muon::test
