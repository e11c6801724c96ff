// Tests of muon::CompositeOptimizer: stepping equals stepping the parts on
// their own, schedulers reach every group, one archive, errors.
#include <gtest/gtest.h>

#include "archive_util.h"
#include "expect_util.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <string>
#include <vector>

#include "muon/optim/composite.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"

namespace {

using muon::test::expect_value_error;

using muon::CompositeOptimizer;
using muon::CompositePart;
using muon::test::load_from_string;
using muon::test::save_to_string;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

struct Params {
  at::Tensor w;  // matrix → Muon
  at::Tensor b;  // vector → AdamW
};

Params make_params(const at::Tensor& w, const at::Tensor& b) { return {leaf(w), leaf(b)}; }

std::unique_ptr<CompositeOptimizer> make_composite(Params& p, double muon_lr = 0.02) {
  std::vector<CompositePart> parts;
  parts.push_back({"muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{p.w}, muon::MuonOptions(muon_lr)),
                   {{"w"}}, nullptr});
  parts.push_back({"adamw", std::make_unique<AdamW>(std::vector<at::Tensor>{p.b}, AdamWOptions(1e-2)),
                   {{"b"}}, nullptr});
  return std::make_unique<CompositeOptimizer>(std::move(parts));
}

TEST(Composite, StepEqualsThePartsOnTheirOwn) {
  at::manual_seed(0);
  const auto w0 = at::randn({6, 4});
  const auto b0 = at::randn({4});
  auto a = make_params(w0, b0);
  auto composite = make_composite(a);
  auto b = make_params(w0, b0);
  muon::Muon muon_alone({b.w}, muon::MuonOptions(0.02));
  AdamW adamw_alone({b.b}, AdamWOptions(1e-2));
  for (int i = 0; i < 3; ++i) {
    const auto gw = at::randn({6, 4});
    const auto gb = at::randn({4});
    a.w.mutable_grad() = gw.clone();
    a.b.mutable_grad() = gb.clone();
    b.w.mutable_grad() = gw.clone();
    b.b.mutable_grad() = gb.clone();
    composite->step();
    muon_alone.step();
    adamw_alone.step();
  }
  EXPECT_TRUE(at::equal(a.w.detach(), b.w.detach()));
  EXPECT_TRUE(at::equal(a.b.detach(), b.b.detach()));
  EXPECT_EQ(composite->state_bytes(), 6 * 4 * 4 + 2 * 4 * 4);  // momentum; exp_avg + exp_avg_sq
}

TEST(Composite, GroupsMirrorThePartsAndTheirLrIsInForce) {
  auto p = make_params(at::randn({6, 4}), at::zeros({4}));
  auto composite = make_composite(p);
  ASSERT_EQ(composite->param_groups().size(), 2u);
  EXPECT_EQ(composite->part_of_group(0), 0u);
  EXPECT_EQ(composite->part_of_group(1), 1u);
  EXPECT_EQ(composite->group_names(1), std::vector<std::string>{"b"});
  EXPECT_EQ(composite->part_name(1), "adamw");
  EXPECT_NE(composite->find_part("adamw"), nullptr);
  EXPECT_EQ(composite->find_part("sgd"), nullptr);
  // AdamW's first step moves every coordinate by ~lr; set it through the composite.
  composite->param_groups()[1].options().set_lr(0.5);
  p.b.mutable_grad() = at::ones({4});
  composite->step();
  EXPECT_NEAR(p.b.detach().abs().max().item<double>(), 0.5, 1e-6);
  EXPECT_DOUBLE_EQ(composite->part(1).param_groups()[0].options().get_lr(), 0.5);
}

TEST(Composite, ClosureRunsOnceAndZeroGradClearsEveryPart) {
  auto p = make_params(at::randn({6, 4}), at::randn({4}));
  auto composite = make_composite(p);
  int calls = 0;
  const auto loss = composite->step([&] {
    ++calls;
    composite->zero_grad();
    auto l = p.w.sum() + p.b.pow(2).sum();
    l.backward();
    return l;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(loss.defined());
  composite->zero_grad();
  EXPECT_EQ(p.w.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(p.b.grad().abs().sum().item<double>(), 0.0);
}

TEST(Composite, ResumedRunIsBitIdenticalWithOptionsRestored) {
  at::manual_seed(1);
  const auto w0 = at::randn({6, 4});
  const auto b0 = at::randn({4});
  std::vector<std::pair<at::Tensor, at::Tensor>> grads;
  for (int i = 0; i < 6; ++i) grads.emplace_back(at::randn({6, 4}), at::randn({4}));
  auto run = [&](Params& p, CompositeOptimizer& opt, int from, int to) {
    for (int i = from; i < to; ++i) {
      p.w.mutable_grad() = grads[static_cast<size_t>(i)].first.clone();
      p.b.mutable_grad() = grads[static_cast<size_t>(i)].second.clone();
      opt.step();
    }
  };
  auto a = make_params(w0, b0);
  auto straight = make_composite(a);
  straight->param_groups()[0].options().set_lr(0.01);
  run(a, *straight, 0, 6);

  auto b = make_params(w0, b0);
  auto first = make_composite(b);
  first->param_groups()[0].options().set_lr(0.01);
  run(b, *first, 0, 3);
  const auto bytes = save_to_string(*first);
  auto c = make_params(b.w, b.b);
  auto second = make_composite(c, /*muon_lr=*/0.3);
  load_from_string(*second, bytes);
  EXPECT_DOUBLE_EQ(second->param_groups()[0].options().get_lr(), 0.01);  // LibTorch's own loader drops options
  run(c, *second, 3, 6);
  EXPECT_TRUE(at::equal(a.w.detach(), c.w.detach()));
  EXPECT_TRUE(at::equal(a.b.detach(), c.b.detach()));
}

TEST(Composite, LoadRejectsOtherStructureAndChangesNothing) {
  auto p = make_params(at::randn({6, 4}), at::randn({4}));
  auto composite = make_composite(p);
  const auto bytes = save_to_string(*composite);
  auto q = make_params(at::randn({6, 4}), at::randn({4}));
  std::vector<CompositePart> parts;
  parts.push_back({"muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{q.w}, muon::MuonOptions(0.7)),
                   {{"w"}}, nullptr});
  parts.push_back({"lion", std::make_unique<muon::Lion>(std::vector<at::Tensor>{q.b}), {{"b"}}, nullptr});
  CompositeOptimizer other(std::move(parts));
  expect_value_error([&] { load_from_string(other, bytes); }, {"part 1", "'adamw'", "'lion'"});
  EXPECT_DOUBLE_EQ(other.param_groups()[0].options().get_lr(), 0.7);
  // Same parts, other parameter names.
  std::vector<CompositePart> renamed;
  renamed.push_back({"muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{q.w}), {{"w2"}}, nullptr});
  renamed.push_back({"adamw", std::make_unique<AdamW>(std::vector<at::Tensor>{q.b}), {{"b"}}, nullptr});
  CompositeOptimizer renamed_opt(std::move(renamed));
  expect_value_error([&] { load_from_string(renamed_opt, bytes); }, {"'w'", "'w2'"});
}

TEST(Composite, PartFailingToLoadLeavesEveryPartAsItWas) {
  // AdamW first, Muon second: the Muon archive has another shape, which only
  // Muon's own load detects, after AdamW's state was already replaced.
  auto make = [](const at::Tensor& b, const at::Tensor& w) {
    std::vector<CompositePart> parts;
    parts.push_back({"adamw", std::make_unique<AdamW>(std::vector<at::Tensor>{b}, AdamWOptions(1e-2)), {{"b"}}, nullptr});
    parts.push_back({"muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{w}), {{"w"}}, nullptr});
    return std::make_unique<CompositeOptimizer>(std::move(parts));
  };
  auto b1 = leaf(at::randn({4}));
  auto w1 = leaf(at::randn({6, 4}));
  auto saved = make(b1, w1);
  b1.mutable_grad() = at::randn({4});
  w1.mutable_grad() = at::randn({6, 4});
  saved->step();
  const auto bytes = save_to_string(*saved);

  auto b2 = leaf(at::randn({4}));
  auto w2 = leaf(at::randn({4, 6}));
  auto target = make(b2, w2);
  b2.mutable_grad() = at::ones({4});
  w2.mutable_grad() = at::ones({4, 6});
  target->step();
  const auto before = save_to_string(target->part(0));
  EXPECT_THROW(load_from_string(*target, bytes), c10::ValueError);
  EXPECT_EQ(save_to_string(target->part(0)), before);  // AdamW's state is back
  EXPECT_EQ(target->state_bytes(), 2 * 4 * 4 + 4 * 6 * 4);
}

TEST(Composite, ConstructionErrors) {
  expect_value_error([] { CompositeOptimizer c({}); }, {"[muon::CompositeOptimizer]", "at least one part"});
  auto w = leaf(at::randn({4, 4}));
  auto v = leaf(at::randn({4, 4}));
  auto two_named = [&](const std::string& second, const at::Tensor& t) {
    return [&, second, t] {
      std::vector<CompositePart> parts;
      parts.push_back({"muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{w}), {}, nullptr});
      parts.push_back({second, std::make_unique<AdamW>(std::vector<at::Tensor>{t}), {}, nullptr});
      CompositeOptimizer c(std::move(parts));
    };
  };
  expect_value_error(two_named("muon", v), {"two parts are named 'muon'"});
  expect_value_error(two_named("adamw", w), {"already in an earlier group"});
  expect_value_error(
      [&] {
        std::vector<CompositePart> parts;
        parts.push_back({"muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{w}), {{"a", "b"}}, nullptr});
        CompositeOptimizer c(std::move(parts));
      },
      {"1 parameters but 2 names"});
}

TEST(Composite, StateBytesOfLibTorchOptimizers) {
  auto p = leaf(at::randn({10}));
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1).momentum(0.9));
  p.mutable_grad() = at::ones({10});
  sgd.step();
  EXPECT_EQ(muon::optimizer_state_bytes(sgd), 10 * 4);
  muon::Lion lion({p});
  lion.step();
  EXPECT_EQ(muon::optimizer_state_bytes(lion), 10 * 4);
}

}  // namespace
