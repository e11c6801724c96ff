// Tests of muon::WarmupDecaySchedule and muon::lr_at: values at the
// boundaries of warmup and decay, per-group scaling, errors.
#include <gtest/gtest.h>

#include "expect_util.h"

#include <torch/optim/sgd.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "muon/schedule.h"

namespace {

using muon::test::expect_value_error;

using muon::DecayStyle;
using muon::LrScheduleOptions;
using muon::WarmupDecaySchedule;

// The schedule's values are a few flops of double arithmetic: 1e-15 relative.
constexpr double kTol = 1e-15;

TEST(LrSchedule, WarmupIsLinearFromInitToLr) {
  const auto o = LrScheduleOptions().lr(1.0).warmup_steps(10).warmup_init(0.1).style("constant");
  EXPECT_NEAR(muon::lr_at(o, 0), 0.1, kTol);
  EXPECT_NEAR(muon::lr_at(o, 5), 0.55, kTol);
  EXPECT_NEAR(muon::lr_at(o, 9), 0.91, kTol);
  EXPECT_NEAR(muon::lr_at(o, 10), 1.0, kTol);
  EXPECT_NEAR(muon::lr_at(o, 1000), 1.0, kTol);  // constant after warmup
}

TEST(LrSchedule, LinearDecayReachesMinLrAtDecaySteps) {
  const auto o = LrScheduleOptions().lr(2.0).min_lr(0.2).warmup_steps(10).decay_steps(110).style("linear");
  EXPECT_NEAR(muon::lr_at(o, 0), 0.0, kTol);
  EXPECT_NEAR(muon::lr_at(o, 10), 2.0, kTol);
  EXPECT_NEAR(muon::lr_at(o, 35), 2.0 - 1.8 * 0.25, kTol);
  EXPECT_NEAR(muon::lr_at(o, 60), 1.1, kTol);
  EXPECT_NEAR(muon::lr_at(o, 109), 2.0 - 1.8 * 0.99, 1e-14);
  EXPECT_NEAR(muon::lr_at(o, 110), 0.2, kTol);
  EXPECT_NEAR(muon::lr_at(o, 5000), 0.2, kTol);
}

TEST(LrSchedule, CosineDecay) {
  const auto o = LrScheduleOptions().lr(1.0).min_lr(0.1).warmup_steps(0).decay_steps(100).style(DecayStyle::kCosine);
  EXPECT_NEAR(muon::lr_at(o, 0), 1.0, kTol);  // no warmup: starts at the peak
  EXPECT_NEAR(muon::lr_at(o, 25), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), kTol);
  EXPECT_NEAR(muon::lr_at(o, 50), 0.55, 1e-15);
  EXPECT_NEAR(muon::lr_at(o, 100), 0.1, kTol);
  EXPECT_NEAR(muon::lr_at(o, 101), 0.1, kTol);
}

TEST(LrSchedule, EveryGroupFollowsTheCurveScaledToItsBaseLr) {
  auto a = at::zeros({2}).requires_grad_(true);
  auto b = at::zeros({2}).requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<torch::optim::SGDOptions>(0.4));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<torch::optim::SGDOptions>(0.1));
  torch::optim::SGD opt(groups, torch::optim::SGDOptions(0.4));
  WarmupDecaySchedule sched(
      opt, LrScheduleOptions().lr(0.4).min_lr(0.04).warmup_steps(4).decay_steps(8).style("linear"));
  auto lr = [&](size_t g) { return opt.param_groups()[g].options().get_lr(); };
  EXPECT_NEAR(lr(0), 0.0, kTol);  // step 0 set at construction
  EXPECT_NEAR(lr(1), 0.0, kTol);
  sched.step();
  sched.step();
  EXPECT_EQ(sched.step_count(), 2);
  EXPECT_NEAR(lr(0), 0.2, kTol);
  EXPECT_NEAR(lr(1), 0.05, kTol);
  sched.set_step(8);
  EXPECT_NEAR(lr(0), 0.04, kTol);
  EXPECT_NEAR(lr(1), 0.01, kTol);  // min_lr scaled by 0.1 / 0.4
  EXPECT_NEAR(sched.current_lr(), 0.04, kTol);
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{0.4, 0.1}));
}

TEST(LrSchedule, Errors) {
  auto a = at::zeros({2}).requires_grad_(true);
  torch::optim::SGD opt(std::vector<at::Tensor>{a}, torch::optim::SGDOptions(0.1));
  auto make = [&](LrScheduleOptions o) { return [&opt, o] { WarmupDecaySchedule s(opt, o); }; };
  expect_value_error(make(LrScheduleOptions().lr(0)), {"[muon::WarmupDecaySchedule]", "lr", "> 0", "0"});
  expect_value_error(make(LrScheduleOptions().lr(1).min_lr(2)), {"min_lr", "2"});
  expect_value_error(make(LrScheduleOptions().warmup_steps(-1)), {"warmup_steps", "-1"});
  expect_value_error(make(LrScheduleOptions().warmup_steps(10).decay_steps(10).style("cosine")),
                     {"decay_steps", "> warmup_steps = 10", "cosine", "10"});
  expect_value_error([] { LrScheduleOptions().style("exp"); }, {"'exp'", "constant, linear, cosine"});
  expect_value_error([] { muon::lr_at(LrScheduleOptions(), -1); }, {"step", "-1"});
}

}  // namespace
