// Tests of muon::Muon: step semantics, matrices side by side on threads,
// per-group options, schedulers, errors and convergence. Exact values against
// the reference step are in test_muon_values.cpp, save/load in
// test_muon_save_load.cpp.
#include <gtest/gtest.h>

#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/optim/schedulers/step_lr.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/muon.h"
#include "kernels/symmetric.h"
#include "muon_reference.h"
#include "optim/muon_internal.h"

namespace muon::test {
namespace {

// Several threads run the fused parameters side by side, one matrix per
// thread with every product and loop of that matrix on its thread alone:
// the parameters must come out as at one thread, to the bit, whichever
// thread took which matrix. A QKV-split group (not fused) runs alongside.
TEST(MuonThreads, SideBySideMatricesGiveTheOneThreadBits) {
  const int before = at::get_num_threads();
  for (const auto compute : {at::kBFloat16, at::kFloat}) {
    auto run = [&](int threads) {
      at::set_num_threads(threads);
      at::manual_seed(11);
      std::vector<at::Tensor> fused;
      for (const auto& shape : std::vector<std::vector<int64_t>>{
               {96, 256}, {256, 96}, {128, 128}, {2, 64, 160}, {32, 16, 3, 3}, {40, 24}}) {
        fused.push_back(at::randn(shape).requires_grad_(true));
      }
      auto qkv = at::randn({48, 32}).requires_grad_(true);
      auto o = MuonOptions(0.05).weight_decay(0.1).stacked_experts(true);
      o.ns().compute_dtype(compute);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(fused, std::make_unique<MuonOptions>(o));
      groups.emplace_back(std::vector<at::Tensor>{qkv},
                          std::make_unique<MuonOptions>(MuonOptions(o).split_sizes({16, 16, 16})));
      Muon opt(std::move(groups));
      fused.push_back(qkv);
      for (int k = 0; k < 3; ++k) {
        for (auto& p : fused) p.mutable_grad() = at::randn(p.sizes());
        opt.step();
      }
      return fused;
    };
    const auto one = run(1);
    const auto runs = muon::detail::side_by_side_steps();
    const auto two = run(2);
    at::set_num_threads(before);
    if (muon::detail::products_follow_thread_scope(compute)) {
      EXPECT_EQ(muon::detail::side_by_side_steps(), runs + 3) << compute;
      for (size_t i = 0; i < one.size(); ++i) {
        EXPECT_TRUE(at::equal(one[i], two[i])) << compute << ", parameter " << i;
      }
    } else {
      // Products on a BLAS with its own threads: one matrix at a time.
      EXPECT_EQ(muon::detail::side_by_side_steps(), runs) << compute;
    }
  }
}

// A tensor listed in two groups would take two updates on one state; it is
// refused at construction as torch.optim refuses it (test_step_guard.cpp
// covers groups added later).
TEST(MuonThreads, TensorInTwoGroupsIsRefused) {
  auto p = at::randn({128, 256}).requires_grad_(true);
  auto q = at::randn({256, 128}).requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p, q}, std::make_unique<MuonOptions>(0.05));
  groups.emplace_back(std::vector<at::Tensor>{p}, std::make_unique<MuonOptions>(0.01));
  expect_value_error([&] { Muon opt(std::move(groups)); },
                     {"some parameters appear in more than one parameter group",
                      "parameter 0 of group 0 (shape [128, 256])", "parameter 0 of group 1"});
}

// ---- step semantics ------------------------------------------------------------

TEST(MuonStep, ParametersWithoutGradientAreSkipped) {
  auto a = leaf(at::randn({4, 6}));
  auto b = leaf(at::randn({6, 4}));
  const auto b_before = b.detach().clone();
  Muon opt({a, b});
  a.mutable_grad() = at::randn({4, 6});
  opt.step();
  EXPECT_TRUE(at::equal(b, b_before));
  EXPECT_EQ(opt.state().count(muon::compat::state_key(b)), 0u);
  EXPECT_EQ(state_of(opt, a).step(), 1);
  opt.step();
  EXPECT_EQ(state_of(opt, a).step(), 2);
}

TEST(MuonStep, ClosureRunsWithGradModeAndLossIsReturned) {
  auto w = leaf(at::randn({5, 3}));
  const auto x = at::randn({8, 5});
  Muon opt({w});
  bool grad_mode_seen = false;
  auto closure = [&] {
    grad_mode_seen = at::GradMode::is_enabled();
    opt.zero_grad();
    auto loss = x.mm(w).pow(2).mean();
    loss.backward();
    return loss;
  };
  at::NoGradGuard outer;  // the closure must still get grad mode
  const auto before = w.detach().clone();
  const auto loss = opt.step(closure);
  EXPECT_TRUE(grad_mode_seen);
  ASSERT_TRUE(loss.defined());
  EXPECT_GT(loss.item<double>(), 0.0);
  EXPECT_FALSE(at::equal(w, before));
}

TEST(MuonStep, NeitherGradNorBufferIsMutatedByOrthogonalization) {
  for (bool nesterov : {false, true}) {
    at::manual_seed(5);
    auto p = leaf(at::randn({10, 6}));
    Muon opt({p}, MuonOptions(0.1).nesterov(nesterov).momentum(0.9).weight_decay(0.1).weight_decay_mode("l2"));
    at::Tensor expected_buf = at::zeros({10, 6});
    for (int k = 0; k < 3; ++k) {
      const auto g = at::randn({10, 6});
      p.mutable_grad() = g.clone();
      const auto p_before = p.detach().clone();
      opt.step();
      EXPECT_TRUE(at::equal(p.grad(), g)) << "p.grad() was modified";
      // EMA buffer of the l2-augmented gradient, in plain ops (fp32 rounding
      // of a few operations: 1e-6 on O(1) values).
      expected_buf = 0.9 * expected_buf + 0.1 * (g + 0.1 * p_before);
      EXPECT_LT(max_diff(state_of(opt, p).momentum_buffer(), expected_buf), 1e-6);
    }
  }
}

TEST(MuonStep, PerGroupOptionsSurviveConstruction) {
  at::manual_seed(21);
  const auto v1 = at::randn({8, 6}, at::kDouble);
  const auto v2 = at::randn({6, 8}, at::kDouble);
  auto p1 = leaf(v1);
  auto p2 = leaf(v2);
  RefOptions o1;
  o1.lr = 0.1;
  o1.mu = 0.5;
  RefOptions o2;
  o2.lr = 0.01;
  o2.mu = 0.9;
  o2.ema = false;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p1}, std::make_unique<MuonOptions>(to_muon(o1)));
  groups.emplace_back(std::vector<at::Tensor>{p2}, std::make_unique<MuonOptions>(to_muon(o2)));
  Muon opt(std::move(groups), MuonOptions(0.5));
  EXPECT_EQ(static_cast<const MuonOptions&>(opt.param_groups()[0].options()), to_muon(o1));
  EXPECT_EQ(static_cast<const MuonOptions&>(opt.param_groups()[1].options()), to_muon(o2));
  RefParam r1{v1.clone(), {}};
  RefParam r2{v2.clone(), {}};
  for (int k = 0; k < 3; ++k) {
    const auto g1 = at::randn({8, 6}, at::kDouble);
    const auto g2 = at::randn({6, 8}, at::kDouble);
    p1.mutable_grad() = g1;
    p2.mutable_grad() = g2;
    ref_step(r1, g1, o1);
    ref_step(r2, g2, o2);
    opt.step();
  }
  EXPECT_LT(max_diff(p1, r1.p), kFp64Tol);
  EXPECT_LT(max_diff(p2, r2.p), kFp64Tol);
}

TEST(MuonStep, GroupWithoutOptionsGetsDefaults) {
  auto p = leaf(at::randn({4, 4}));
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p});
  Muon opt(std::move(groups), MuonOptions(0.3).momentum(0.8));
  EXPECT_EQ(static_cast<const MuonOptions&>(opt.param_groups()[0].options()),
            MuonOptions(0.3).momentum(0.8));
}

// ---- schedulers ---------------------------------------------------------------

TEST(MuonSchedulers, GetAndSetLr) {
  MuonOptions o(0.05);
  EXPECT_EQ(o.get_lr(), 0.05);
  o.set_lr(0.01);
  EXPECT_EQ(o.lr(), 0.01);
}

TEST(MuonSchedulers, StepLrDrivesEveryGroup) {
  at::manual_seed(31);
  const auto v = at::randn({6, 4}, at::kDouble);
  auto p = leaf(v);
  auto q = leaf(at::randn({4, 4}, at::kDouble));
  RefOptions o;
  o.lr = 0.08;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p}, std::make_unique<MuonOptions>(to_muon(o)));
  groups.emplace_back(std::vector<at::Tensor>{q}, std::make_unique<MuonOptions>(to_muon(o).lr(0.2)));
  Muon opt(std::move(groups));
  torch::optim::StepLR sched(opt, /*step_size=*/2, /*gamma=*/0.5);
  RefParam ref{v.clone(), {}};
  std::vector<double> used;
  for (int k = 0; k < 6; ++k) {
    const auto g = at::randn({6, 4}, at::kDouble);
    p.mutable_grad() = g;
    o.lr = opt.param_groups()[0].options().get_lr();  // what the scheduler set
    used.push_back(o.lr);
    ref_step(ref, g, o);
    opt.step();
    sched.step();
  }
  // Decayed at least twice, every group by the same factor.
  const double lr0 = opt.param_groups()[0].options().get_lr();
  const double lr1 = opt.param_groups()[1].options().get_lr();
  EXPECT_LE(lr0, 0.08 * 0.25 * (1 + 1e-12));
  EXPECT_DOUBLE_EQ(lr1 / lr0, 0.2 / 0.08);
  EXPECT_GT(used.front(), used.back());
  EXPECT_LT(max_diff(p, ref.p), kFp64Tol);
}

// Linear warm-up, as a user-written LRScheduler.
class Warmup : public torch::optim::LRScheduler {
 public:
  Warmup(torch::optim::Optimizer& opt, double peak, unsigned steps)
      : LRScheduler(opt), peak_(peak), steps_(steps) {}

 private:
  std::vector<double> get_lrs() override {
    const double lr = peak_ * std::min(1.0, static_cast<double>(step_count_ + 1) / steps_);
    return std::vector<double>(get_current_lrs().size(), lr);
  }
  double peak_;
  unsigned steps_;
};

TEST(MuonSchedulers, CustomSchedulerSetsLr) {
  auto p = leaf(at::randn({4, 4}));
  Muon opt({p}, MuonOptions(0.0));
  Warmup sched(opt, 0.04, 4);
  std::vector<double> seen;
  for (int k = 0; k < 5; ++k) {
    sched.step();
    seen.push_back(opt.param_groups()[0].options().get_lr());
  }
  EXPECT_DOUBLE_EQ(seen[0], 0.01);
  EXPECT_DOUBLE_EQ(seen[2], 0.03);
  EXPECT_DOUBLE_EQ(seen[4], 0.04);
}

// ---- errors -------------------------------------------------------------------

TEST(MuonErrors, InvalidOptionsNameArgumentAndValue) {
  auto p = leaf(at::randn({4, 4}));
  auto make = [&](MuonOptions o) { return [p, o] { Muon opt({p}, o); }; };
  expect_value_error(make(MuonOptions(-0.1)), {"[muon::Muon]", "lr", "-0.1"});
  expect_value_error(make(MuonOptions().momentum(1.0)), {"[muon::Muon]", "momentum", "[0, 1)", "1"});
  expect_value_error(make(MuonOptions().momentum(-0.5)), {"momentum", "-0.5"});
  expect_value_error(make(MuonOptions().weight_decay(-1e-3)), {"[muon::Muon]", "weight_decay", "-0.001"});
  expect_value_error(make(MuonOptions().extra_scale_factor(0)), {"extra_scale_factor", "0"});
  expect_value_error(make(MuonOptions().num_query_groups(0).split_sizes({4})), {"num_query_groups", "0"});
  expect_value_error(make(MuonOptions().split_sizes({4, 0})), {"split_sizes[1]", "0"});
}

TEST(MuonErrors, InvalidNewtonSchulzOptions) {
  expect_value_error([] { MuonOptions().ns_eps(0.0); }, {"[muon::Muon]", "ns_eps", "0"});
  expect_value_error([] { MuonOptions().ns_eps(-1e-7); }, {"ns_eps", "-1e-07"});
  expect_value_error([] { MuonOptions().ns_steps(0); }, {"[muon::Muon]", "ns_steps", "[1, 100)", "0"});
  expect_value_error([] { MuonOptions().ns_steps(100); }, {"ns_steps", "100"});
  expect_value_error([] { MuonOptions().ns_coefficients("jordan"); },
                     {"[muon::Muon]", "ns_coefficients", "'jordan'", "quintic"});
  expect_value_error([] { MuonOptions().ns_compute_dtype(at::kInt); }, {"ns_compute_dtype", "Int"});
}

TEST(MuonErrors, UnknownModes) {
  expect_value_error([] { MuonOptions().momentum_style("nesterov"); },
                     {"[muon::Muon]", "momentum_style", "'nesterov'", "ema, classic"});
  expect_value_error([] { MuonOptions().weight_decay_mode("l1"); },
                     {"weight_decay_mode", "'l1'", "decoupled, independent, l2"});
  expect_value_error([] { MuonOptions().scale_mode("rms"); }, {"scale_mode", "'rms'", "spectral"});
}

TEST(MuonErrors, BadParameters) {
  expect_value_error([] { Muon opt({leaf(at::randn({8}))}); },
                     {"[muon::Muon]", "shape [8]", "ndim 1", "MuonWithAdamW"});
  expect_value_error([] { Muon opt({leaf(at::randn({0, 4}))}); }, {"[muon::Muon]", "zero size", "[0, 4]"});
  expect_value_error([] { Muon opt({leaf(at::randn({10, 4}))}, MuonOptions().split_sizes({4, 2, 2})); },
                     {"split_sizes", "8 rows", "10 rows"});
}

TEST(MuonErrors, ChecksAgainAtStep) {
  auto p = leaf(at::randn({4, 4}));
  Muon opt({p});
  p.mutable_grad() = at::randn({4, 4});
  opt.param_groups()[0].options().set_lr(-1.0);
  expect_value_error([&] { opt.step(); }, {"lr", "-1"});
  opt.param_groups()[0].options().set_lr(0.02);
  opt.add_param_group(torch::optim::OptimizerParamGroup({leaf(at::randn({3}))}));
  expect_value_error([&] { opt.step(); }, {"ndim 1"});
}

// ---- convergence ----------------------------------------------------------------

TEST(MuonConvergence, LowersTheLossOfASmallNetwork) {
  // A bias-free 2-layer tanh network fits a random teacher of the same shape.
  at::manual_seed(0);
  const auto x = at::randn({256, 16});
  const auto teacher1 = at::randn({16, 32}) / 4.0;
  const auto teacher2 = at::randn({32, 4}) / 5.0;
  const auto y = at::tanh(x.mm(teacher1)).mm(teacher2);
  auto w1 = leaf(at::randn({32, 16}) / 4.0);  // (out, in), as nn::Linear stores it
  auto w2 = leaf(at::randn({4, 32}) / 5.0);
  Muon opt({w1, w2}, MuonOptions(0.02));
  auto loss_fn = [&] { return (at::tanh(x.mm(w1.t())).mm(w2.t()) - y).pow(2).mean(); };
  const double initial = loss_fn().item<double>();
  double last = initial;
  for (int k = 0; k < 150; ++k) {
    last = opt.step([&] {
                opt.zero_grad();
                auto loss = loss_fn();
                loss.backward();
                return loss;
              })
               .item<double>();
  }
  EXPECT_LT(last, 0.1 * initial) << "initial " << initial << " final " << last;
}

}  // namespace
}  // namespace muon::test
