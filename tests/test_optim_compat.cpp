// Tests of muon/compat.h against the installed LibTorch.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <vector>

#include "muon/compat.h"
#include "tensor_util.h"

namespace {

using muon::test::leaf;

TEST(Compat, StateKeyIsTheKeyLibTorchUses) {
  auto p = leaf(at::randn({3, 3}));
  torch::optim::AdamW opt({p});
  p.mutable_grad() = at::ones({3, 3});
  opt.step();
  ASSERT_EQ(opt.state().size(), 1u);
  EXPECT_EQ(opt.state().count(muon::compat::state_key(p)), 1u);
  auto other = leaf(at::randn({3, 3}));
  EXPECT_EQ(opt.state().count(muon::compat::state_key(other)), 0u);
}

TEST(Compat, ZeroGrad) {
  auto p = leaf(at::randn({2, 2}));
  torch::optim::AdamW opt({p});
  p.mutable_grad() = at::ones({2, 2});
  muon::compat::zero_grad(opt, /*set_to_none=*/false);
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  muon::compat::zero_grad(opt);
  EXPECT_FALSE(p.grad().defined());
}

TEST(Compat, ReapplyGroupOptions) {
  auto p = leaf(at::randn({2, 2}));
  auto q = leaf(at::randn({2, 2}));
  std::vector<torch::optim::OptimizerParamGroup> given;
  given.emplace_back(std::vector<at::Tensor>{p},
                     std::make_unique<torch::optim::AdamWOptions>(0.5));
  given.emplace_back(std::vector<at::Tensor>{q});
  torch::optim::AdamW opt(given, torch::optim::AdamWOptions(0.1));
  opt.param_groups()[0].options().set_lr(0.7);  // as if a base constructor dropped it
  muon::compat::reapply_group_options(opt, given);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.5);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), 0.1);
}

}  // namespace
