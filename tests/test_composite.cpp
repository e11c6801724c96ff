// Tests of muon::CompositeOptimizer: stepping equals stepping the parts on
// their own, schedulers reach every group, one archive, errors.
#include <gtest/gtest.h>

#include "archive_util.h"
#include "tensor_util.h"
#include "expect_util.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <string>
#include <vector>

#include "muon/compat.h"
#include "muon/optim/composite.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"
#include "muon/optim/state_bytes.h"

namespace muon::test {
namespace {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;

struct Params {
  at::Tensor w;  // matrix → Muon
  at::Tensor b;  // vector → AdamW
};

Params make_params(const at::Tensor& w, const at::Tensor& b) { return {leaf(w), leaf(b)}; }

CompositePart make_part(std::string name, std::unique_ptr<torch::optim::Optimizer> optimizer,
                        std::vector<std::vector<std::string>> group_names) {
  CompositePart part;
  part.name = std::move(name);
  part.optimizer = std::move(optimizer);
  part.group_names = std::move(group_names);
  return part;
}

std::unique_ptr<CompositeOptimizer> make_composite(Params& p, double muon_lr = 0.02) {
  std::vector<CompositePart> parts;
  parts.push_back(make_part("muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{p.w}, muon::MuonOptions(muon_lr)),
                            {{"w"}}));
  parts.push_back(make_part("adamw", std::make_unique<AdamW>(std::vector<at::Tensor>{p.b}, AdamWOptions(1e-2)),
                            {{"b"}}));
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
  // In place (1.13's only behaviour), then to undefined (2.x's default):
  // either way it reaches the parameters of both parts.
  muon::compat::zero_grad(*composite, /*set_to_none=*/false);
  ASSERT_TRUE(p.w.grad().defined());
  EXPECT_EQ(p.w.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(p.b.grad().abs().sum().item<double>(), 0.0);
  muon::compat::zero_grad(*composite, /*set_to_none=*/true);
  EXPECT_FALSE(p.w.grad().defined());
  EXPECT_FALSE(p.b.grad().defined());
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
  parts.push_back(make_part("muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{q.w}, muon::MuonOptions(0.7)),
                            {{"w"}}));
  parts.push_back(make_part("lion", std::make_unique<muon::Lion>(std::vector<at::Tensor>{q.b}), {{"b"}}));
  CompositeOptimizer other(std::move(parts));
  expect_value_error([&] { load_from_string(other, bytes); }, {"part 1", "'adamw'", "'lion'"});
  EXPECT_DOUBLE_EQ(other.param_groups()[0].options().get_lr(), 0.7);
  // Same parts, other parameter names.
  std::vector<CompositePart> renamed;
  renamed.push_back(make_part("muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{q.w}), {{"w2"}}));
  renamed.push_back(make_part("adamw", std::make_unique<AdamW>(std::vector<at::Tensor>{q.b}), {{"b"}}));
  CompositeOptimizer renamed_opt(std::move(renamed));
  expect_value_error([&] { load_from_string(renamed_opt, bytes); }, {"'w'", "'w2'"});
}

TEST(Composite, PartFailingToLoadLeavesEveryPartAsItWas) {
  // AdamW first, Muon second: the Muon archive has another shape, which only
  // Muon's own load detects, after AdamW's state was already replaced.
  auto make = [](const at::Tensor& b, const at::Tensor& w) {
    std::vector<CompositePart> parts;
    parts.push_back(make_part("adamw", std::make_unique<AdamW>(std::vector<at::Tensor>{b}, AdamWOptions(1e-2)), {{"b"}}));
    parts.push_back(make_part("muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{w}), {{"w"}}));
    return std::make_unique<CompositeOptimizer>(std::move(parts));
  };
  // A fresh bias (4) and weight of `w_shape` in `make`'s composite, stepped
  // once on random gradients or on ones.
  auto stepped = [&](const std::vector<int64_t>& w_shape, bool random_grads) {
    auto b = leaf(at::randn({4}));
    auto w = leaf(at::randn(w_shape));
    auto opt = make(b, w);
    const auto grad = [&](at::IntArrayRef shape) {
      return random_grads ? at::randn(shape) : at::ones(shape);
    };
    b.mutable_grad() = grad({4});
    w.mutable_grad() = grad(w_shape);
    opt->step();
    return opt;
  };
  auto saved = stepped({6, 4}, /*random_grads=*/true);
  const auto bytes = save_to_string(*saved);

  auto target = stepped({4, 6}, /*random_grads=*/false);
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
      parts.push_back(make_part("muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{w}), {}));
      parts.push_back(make_part(second, std::make_unique<AdamW>(std::vector<at::Tensor>{t}), {}));
      CompositeOptimizer c(std::move(parts));
    };
  };
  expect_value_error(two_named("muon", v), {"two parts are named 'muon'"});
  expect_value_error(two_named("adamw", w), {"already in an earlier group"});
  expect_value_error(
      [&] {
        std::vector<CompositePart> parts;
        parts.push_back(make_part("muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{w}), {{"a", "b"}}));
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

// ---- one state-bytes interface --------------------------------------------------

// A user optimizer that reports its own state size through muon::StateBytes.
class CountingSgd : public torch::optim::Optimizer, public muon::StateBytes {
 public:
  explicit CountingSgd(std::vector<at::Tensor> params)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<torch::optim::SGDOptions>(0.1)) {}
  at::Tensor step(LossClosure closure = nullptr) override {
    ++steps;
    return closure ? closure() : at::Tensor();
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
  int64_t state_bytes() const override { return 1000 + steps; }
  int64_t steps = 0;
};

TEST(StateBytes, UserOptimizerIsAskedThroughTheInterface) {
  auto w = leaf(at::randn({6, 4}));
  auto b = leaf(at::randn({4}));
  std::vector<CompositePart> parts;
  parts.push_back(make_part("muon", std::make_unique<muon::Muon>(std::vector<at::Tensor>{w}), {{"w"}}));
  parts.push_back(make_part("counting", std::make_unique<CountingSgd>(std::vector<at::Tensor>{b}), {{"b"}}));
  CompositeOptimizer composite(std::move(parts));
  EXPECT_EQ(muon::optimizer_state_bytes(composite.part(1)), 1000);
  w.mutable_grad() = at::randn({6, 4});
  composite.step();
  EXPECT_EQ(composite.state_bytes(), 6 * 4 * 4 + 1001);
  // The composite itself is asked the same way.
  const torch::optim::Optimizer& as_optimizer = composite;
  EXPECT_EQ(muon::optimizer_state_bytes(as_optimizer), composite.state_bytes());
}

TEST(StateBytes, LibraryOptimizersImplementTheInterface) {
  auto w = leaf(at::randn({6, 4}));
  auto b = leaf(at::randn({4}));
  muon::Lion lion({b});
  EXPECT_NE(dynamic_cast<const muon::StateBytes*>(&lion), nullptr);
  auto p = make_params(at::randn({6, 4}), at::randn({4}));
  auto composite = make_composite(p);
  EXPECT_NE(dynamic_cast<const muon::StateBytes*>(composite.get()), nullptr);
  torch::OrderedDict<std::string, at::Tensor> named;
  named.insert("fc.weight", w);
  named.insert("fc.bias", b);
  muon::MuonWithAdamW hybrid(named);
  w.mutable_grad() = at::randn({6, 4});
  b.mutable_grad() = at::randn({4});
  hybrid.step();
  const torch::optim::Optimizer& as_optimizer = hybrid;
  EXPECT_EQ(muon::optimizer_state_bytes(as_optimizer), 6 * 4 * 4 + 2 * 4 * 4);
  // LibTorch's own optimizers without StateBytes are counted from their state.
  auto q = leaf(at::randn({3}));
  AdamW adamw(std::vector<at::Tensor>{q});
  q.mutable_grad() = at::ones({3});
  adamw.step();
  EXPECT_EQ(muon::optimizer_state_bytes(adamw), 2 * 3 * 4);
}

// ---- group mirroring ------------------------------------------------------------

TEST(Composite, GroupMirrorHandsOptionsBothWays) {
  auto w = leaf(at::randn({6, 4}));
  muon::Muon inner({w}, muon::MuonOptions(0.02));
  std::vector<torch::optim::OptimizerParamGroup> outer;
  muon::GroupMirror mirror;
  mirror.mirror(inner, outer);
  outer.emplace_back(std::vector<at::Tensor>{}, std::make_unique<torch::optim::SGDOptions>(0.0));
  ASSERT_EQ(mirror.size(), 1u);
  EXPECT_TRUE(outer[0].params()[0].is_same(w));
  outer[0].options().set_lr(0.5);
  mirror.hand_options(outer, /*extra=*/1, "[test] ");
  EXPECT_DOUBLE_EQ(inner.param_groups()[0].options().get_lr(), 0.5);
  inner.param_groups()[0].options().set_lr(0.25);
  mirror.take_options(outer);
  EXPECT_DOUBLE_EQ(outer[0].options().get_lr(), 0.25);
  // A group added behind the mirror's back, or options of another type.
  expect_value_error([&] { mirror.hand_options(outer, /*extra=*/0, "[test] "); },
                     {"[test] ", "groups cannot be added"});
  outer[0].set_options(std::make_unique<AdamWOptions>(0.1));
  expect_value_error([&] { mirror.hand_options(outer, 1, "[test] "); },
                     {"[test] ", "param group 0 must hold options of type"});
}

TEST(Composite, AddedGroupIsAnError) {
  auto p = make_params(at::randn({6, 4}), at::randn({4}));
  auto composite = make_composite(p);
  composite->add_param_group(
      torch::optim::OptimizerParamGroup({leaf(at::randn({3}))}, std::make_unique<AdamWOptions>(0.1)));
  expect_value_error([&] { composite->step(); },
                     {"[muon::CompositeOptimizer]", "groups cannot be added after construction"});
}

}  // namespace
}  // namespace muon::test
