// Tests of routing and muon::MuonWithAdamW (Muon + torch::optim::AdamW).
#include <gtest/gtest.h>

#include "archive_util.h"
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/serialize/archive.h>

#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "expect_util.h"
#include "muon/compat.h"
#include "muon/optim/hybrid.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

using torch::optim::AdamWOptions;

// A tiny language-model-shaped network: embedding, one residual MLP block
// with a LayerNorm and biases, an output head.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", torch::nn::Linear(d, 2 * d));
    fc2 = register_module("fc2", torch::nn::Linear(2 * d, d));
  }
  at::Tensor forward(const at::Tensor& x) { return x + fc2(at::relu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(Block);

struct TinyLmImpl : torch::nn::Module {
  TinyLmImpl(int64_t vocab, int64_t d) {
    embed = register_module("embed", torch::nn::Embedding(vocab, d));
    block = register_module("block", Block(d));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(d, vocab).bias(false)));
  }
  at::Tensor forward(const at::Tensor& tokens) { return lm_head(block(embed(tokens))); }
  torch::nn::Embedding embed{nullptr};
  Block block{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TinyLm);

constexpr int64_t kVocab = 32;
constexpr int64_t kDim = 16;

TinyLm make_model(uint64_t seed) { return seeded_module<TinyLm>(seed, kVocab, kDim); }

// Copies every parameter value of `from` into `to` (same architecture).
void copy_params(const TinyLm& from, TinyLm& to) {
  at::NoGradGuard no_grad;
  auto src = from->named_parameters();
  for (auto& item : to->named_parameters()) item.value().copy_(src[item.key()]);
}

// Two models with the same values, `first`'s: the second is made from
// `second_seed` and then overwritten, so that nothing but the copy makes
// them equal.
std::pair<TinyLm, TinyLm> equal_models(uint64_t first_seed, uint64_t second_seed) {
  auto first = make_model(first_seed);
  auto second = make_model(second_seed);
  copy_params(first, second);
  return {first, second};
}

// Deterministic synthetic gradients, one set per step, by parameter name.
std::vector<std::map<std::string, at::Tensor>> make_grads(const TinyLm& model, int steps) {
  at::manual_seed(99);
  std::vector<std::map<std::string, at::Tensor>> out(static_cast<size_t>(steps));
  for (auto& step : out) {
    for (const auto& item : model->named_parameters()) step[item.key()] = at::randn_like(item.value());
  }
  return out;
}

void set_grads(TinyLm& model, const std::map<std::string, at::Tensor>& grads) {
  for (auto& item : model->named_parameters()) item.value().mutable_grad() = grads.at(item.key()).clone();
}

std::map<std::string, Route> routes_by_name(const std::vector<muon::RouteDecision>& ds) {
  std::map<std::string, Route> out;
  for (const auto& d : ds) out[d.name] = d.route;
  return out;
}

// ---- routing ------------------------------------------------------------------

TEST(Routing, GlobMatch) {
  EXPECT_TRUE(muon::glob_match("*embed*", "model.embed_tokens.weight"));
  EXPECT_TRUE(muon::glob_match("lm_head.*", "lm_head.weight"));
  EXPECT_FALSE(muon::glob_match("lm_head.*", "x.lm_head.weight"));
  EXPECT_TRUE(muon::glob_match("*.lm_head.*", "x.lm_head.weight"));
  EXPECT_TRUE(muon::glob_match("block.fc?.weight", "block.fc1.weight"));
  EXPECT_FALSE(muon::glob_match("block.fc?.weight", "block.fc12.weight"));
  EXPECT_TRUE(muon::glob_match("*", ""));
  EXPECT_TRUE(muon::glob_match("a*b*c", "a_x_b_y_c"));
  EXPECT_FALSE(muon::glob_match("a*b*c", "a_x_b_y_d"));
}

TEST(Routing, DefaultRules) {
  auto model = make_model(1);
  const auto routes = routes_by_name(muon::route_parameters(model->named_parameters()));
  EXPECT_EQ(routes.at("embed.weight"), Route::kAdamW);
  EXPECT_EQ(routes.at("lm_head.weight"), Route::kAdamW);
  EXPECT_EQ(routes.at("block.norm.weight"), Route::kAdamW);
  EXPECT_EQ(routes.at("block.norm.bias"), Route::kAdamW);
  EXPECT_EQ(routes.at("block.fc1.bias"), Route::kAdamW);
  EXPECT_EQ(routes.at("block.fc1.weight"), Route::kMuon);
  EXPECT_EQ(routes.at("block.fc2.weight"), Route::kMuon);
  RoutingRules rules;
  EXPECT_EQ(rules.route("model.layers.0.mlp.output.dense.weight", at::zeros({4, 4})).route,
            Route::kMuon);  // nested "output" is a hidden matrix
  EXPECT_EQ(rules.route("output.weight", at::zeros({4, 4})).route, Route::kAdamW);
  EXPECT_EQ(rules.route("transformer.wte.weight", at::zeros({4, 4})).reason, "embedding '*.wte.*'");
}

TEST(Routing, OverridesComeFirstInOrder) {
  auto model = make_model(1);
  RoutingRules rules;
  rules.add_override("block.fc2.*", "adamw").add_override("block.fc?.weight", Route::kMuon);
  const auto ds = muon::route_parameters(model->named_parameters(), rules);
  const auto routes = routes_by_name(ds);
  EXPECT_EQ(routes.at("block.fc2.weight"), Route::kAdamW);
  EXPECT_EQ(routes.at("block.fc1.weight"), Route::kMuon);
  for (const auto& d : ds) {
    if (d.name == "block.fc2.weight") {
      EXPECT_EQ(d.reason, "override 'block.fc2.*'");
    }
  }
  // block.norm.weight is 1-D: sending it to Muon is an error naming it.
  RoutingRules bad;
  bad.add_override("block.norm.*", Route::kMuon);
  try {
    muon::route_parameters(model->named_parameters(), bad);
    ADD_FAILURE() << "no exception";
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("block.norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ndim >= 2"), std::string::npos) << msg;
  }
  EXPECT_THROW(RoutingRules().add_override("x", "sgd"), c10::ValueError);
}

TEST(Routing, TableShowsEveryParameter) {
  auto model = make_model(1);
  MuonWithAdamW opt(model->named_parameters());
  const auto table = opt.routing_table();
  for (const auto& item : model->named_parameters()) {
    EXPECT_NE(table.find(item.key()), std::string::npos) << item.key();
  }
  EXPECT_NE(table.find("matrix"), std::string::npos);
  EXPECT_NE(table.find("embedding '*embed*'"), std::string::npos);
  EXPECT_NE(table.find("output head 'lm_head.*'"), std::string::npos);
  EXPECT_NE(table.find("ndim < 2"), std::string::npos);
}

TEST(Routing, DefaultRulesAreOneListInOrder) {
  using muon::DefaultRule;
  EXPECT_EQ(muon::default_routing_rules(),
            (std::vector<DefaultRule>{DefaultRule::kNdimBelow2, DefaultRule::kEmbedding,
                                      DefaultRule::kOutputHead}));
  EXPECT_EQ(muon::to_string(DefaultRule::kNdimBelow2), "ndim < 2");
  EXPECT_EQ(muon::to_string(DefaultRule::kEmbedding), "embedding");
  EXPECT_EQ(muon::to_string(DefaultRule::kOutputHead), "output head");
  // A 1-D embedding-named parameter: the first rule in the list decides.
  EXPECT_EQ(RoutingRules().route("embed.bias", at::zeros({4})).reason, "ndim < 2");
  EXPECT_EQ(RoutingRules().route("wte.lm_head.weight", at::zeros({4, 4})).reason, "embedding 'wte.*'");
  muon::test::expect_value_error([] { muon::parse_route("sgd"); },
                                 {"[muon::RoutingRules]", "unknown route 'sgd'", "muon, adamw"});
}

// ---- the hybrid optimizer -------------------------------------------------------

TEST(Hybrid, GroupsAndRouting) {
  auto model = make_model(1);
  MuonWithAdamW opt(model->named_parameters());
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_TRUE(opt.is_muon_group(0));
  EXPECT_FALSE(opt.is_muon_group(1));
  EXPECT_EQ(opt.param_groups()[0].params().size(), 2u);  // fc1.weight, fc2.weight
  EXPECT_EQ(opt.param_groups()[1].params().size(), 6u);
  EXPECT_EQ(static_cast<const AdamWOptions&>(opt.param_groups()[1].options()),
            muon::default_aux_adamw_options());
  for (const auto& d : opt.routing()) EXPECT_EQ(d.group, d.route == Route::kMuon ? 0 : 1) << d.name;
  ASSERT_NE(opt.muon(), nullptr);
  ASSERT_NE(opt.adamw(), nullptr);
}

TEST(Hybrid, StepEqualsStandaloneMuonAndTorchAdamW) {
  auto [model, twin] = equal_models(2, 3);
  const auto grads = make_grads(model, 4);
  MuonWithAdamWOptions options;
  options.muon(MuonOptions(0.03).weight_decay(0.01)).adamw(AdamWOptions(1e-3).weight_decay(0.05));
  MuonWithAdamW hybrid(model->named_parameters(), options);

  std::vector<at::Tensor> matrices;
  std::vector<at::Tensor> others;
  for (const auto& d : muon::route_parameters(twin->named_parameters())) {
    (d.route == Route::kMuon ? matrices : others).push_back(twin->named_parameters()[d.name]);
  }
  muon::Muon muon_alone(matrices, options.muon());
  torch::optim::AdamW adamw_alone(others, options.adamw());
  for (const auto& g : grads) {
    set_grads(model, g);
    set_grads(twin, g);
    hybrid.step();
    muon_alone.step();
    adamw_alone.step();
  }
  auto twin_params = twin->named_parameters();
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), twin_params[item.key()])) << item.key();
  }
  // Muon: one fp32 momentum buffer per matrix; AdamW: two moments per element.
  int64_t muon_numel = 0;
  int64_t adamw_numel = 0;
  for (const auto& t : matrices) muon_numel += t.numel();
  for (const auto& t : others) adamw_numel += t.numel();
  EXPECT_EQ(hybrid.state_bytes(), 4 * muon_numel + 8 * adamw_numel);
}

TEST(Hybrid, SchedulerSeesEveryGroup) {
  auto model = make_model(4);
  MuonWithAdamW opt(model->named_parameters());
  torch::optim::StepLR sched(opt, /*step_size=*/1, /*gamma=*/0.5);
  const double muon_lr = opt.param_groups()[0].options().get_lr();
  const double adamw_lr = opt.param_groups()[1].options().get_lr();
  const auto grads = make_grads(model, 3);
  for (const auto& g : grads) {
    set_grads(model, g);
    opt.step();
    sched.step();
  }
  const double f = opt.param_groups()[0].options().get_lr() / muon_lr;
  EXPECT_LT(f, 1.0);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), adamw_lr * f);
  // The inner optimizers ran with the scheduled rates.
  set_grads(model, grads[0]);
  opt.step();
  EXPECT_DOUBLE_EQ(opt.muon()->param_groups()[0].options().get_lr(), muon_lr * f);
  EXPECT_DOUBLE_EQ(opt.adamw()->param_groups()[0].options().get_lr(), adamw_lr * f);
}

TEST(Hybrid, ZeroGradAndClosure) {
  auto model = make_model(5);
  MuonWithAdamW opt(model->named_parameters());
  const auto tokens = at::randint(kVocab, {8}, at::kLong);
  auto loss_fn = [&] {
    auto logits = model->forward(tokens);
    return at::cross_entropy_loss(logits, (tokens * 7 + 3) % kVocab);
  };
  bool grad_mode_seen = false;
  at::NoGradGuard outer;
  const auto loss = opt.step([&] {
    grad_mode_seen = at::GradMode::is_enabled();
    muon::compat::zero_grad(opt);
    auto l = loss_fn();
    l.backward();
    return l;
  });
  EXPECT_TRUE(grad_mode_seen);
  EXPECT_TRUE(loss.defined());
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  muon::compat::zero_grad(opt, /*set_to_none=*/false);
  for (const auto& p : model->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
  muon::compat::zero_grad(opt, /*set_to_none=*/true);
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Hybrid, ResumedRunIsBitIdentical) {
  auto [straight, first] = equal_models(6, 7);
  const auto grads = make_grads(straight, 6);
  MuonWithAdamWOptions options;
  options.muon(MuonOptions(0.02).weight_decay(0.1)).adamw(AdamWOptions(3e-3));

  MuonWithAdamW opt_a(straight->named_parameters(), options);
  for (const auto& g : grads) {
    set_grads(straight, g);
    opt_a.step();
  }

  MuonWithAdamW opt_b(first->named_parameters(), options);
  for (int k = 0; k < 3; ++k) {
    set_grads(first, grads[k]);
    opt_b.step();
  }
  opt_b.param_groups()[1].options().set_lr(2e-3);  // a scheduler's change is saved too
  const auto bytes = save_to_string(opt_b);

  auto resumed = make_model(8);
  copy_params(first, resumed);
  MuonWithAdamW opt_c(resumed->named_parameters());  // default options: the archive's win
  load_from_string(opt_c, bytes);
  EXPECT_DOUBLE_EQ(opt_c.param_groups()[1].options().get_lr(), 2e-3);
  opt_c.param_groups()[1].options().set_lr(3e-3);
  EXPECT_EQ(static_cast<const MuonOptions&>(opt_c.param_groups()[0].options()), options.muon());
  for (int k = 3; k < 6; ++k) {
    set_grads(resumed, grads[k]);
    opt_c.step();
  }
  auto want = straight->named_parameters();
  for (const auto& item : resumed->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), want[item.key()])) << item.key();
  }
}

TEST(Hybrid, LoadRejectsOtherRouting) {
  auto model = make_model(9);
  MuonWithAdamW opt(model->named_parameters());
  const auto bytes = save_to_string(opt);
  auto other = make_model(9);
  MuonWithAdamWOptions options;
  options.routing(RoutingRules().add_override("block.fc2.weight", Route::kAdamW));
  MuonWithAdamW different(other->named_parameters(), options);
  EXPECT_THROW(load_from_string(different, bytes), c10::ValueError);
}

TEST(Hybrid, PatternGroups) {
  auto model = make_model(10);
  MuonWithAdamWOptions options;
  options.muon_group("block.fc1.weight", MuonOptions(0.01).split_sizes({kDim, kDim}))
      .adamw_group("block.norm.*", AdamWOptions(1e-2).weight_decay(0));
  MuonWithAdamW opt(model->named_parameters(), options);
  ASSERT_EQ(opt.param_groups().size(), 4u);
  EXPECT_TRUE(opt.is_muon_group(1));
  EXPECT_FALSE(opt.is_muon_group(2));
  EXPECT_EQ(static_cast<const MuonOptions&>(opt.param_groups()[1].options()).split_sizes(),
            (std::vector<int64_t>{kDim, kDim}));
  EXPECT_DOUBLE_EQ(opt.param_groups()[3].options().get_lr(), 1e-2);
  const std::map<std::string, int64_t> want = {
      {"block.fc1.weight", 1}, {"block.fc2.weight", 0}, {"block.norm.bias", 3}, {"embed.weight", 2}};
  for (const auto& d : opt.routing()) {
    const auto it = want.find(d.name);
    if (it != want.end()) {
      EXPECT_EQ(d.group, it->second) << d.name;
    }
  }
  const auto grads = make_grads(model, 2);
  for (const auto& g : grads) {
    set_grads(model, g);
    opt.step();
  }
  // A pattern that matches nothing is a mistake worth an error.
  MuonWithAdamWOptions typo;
  typo.muon_group("block.qkv.weight", MuonOptions());
  EXPECT_THROW(MuonWithAdamW(model->named_parameters(), typo), c10::ValueError);
}

TEST(Hybrid, TiedWeightIsUpdatedOnce) {
  auto model = std::make_shared<torch::nn::Module>();
  at::manual_seed(11);
  auto w = model->register_parameter("w", at::randn({6, 4}));
  auto child = model->register_module("child", std::make_shared<torch::nn::Module>());
  child->register_parameter("tied", w);
  const auto named = model->named_parameters();
  ASSERT_EQ(named.size(), 2u);
  MuonWithAdamW opt(named);
  EXPECT_EQ(opt.param_groups()[0].params().size(), 1u);
  EXPECT_EQ(opt.routing()[1].reason, "same tensor as 'w'");
  EXPECT_EQ(opt.routing()[1].group, 0);

  auto alone = w.detach().clone();
  alone.set_requires_grad(true);
  muon::Muon reference({alone});
  const auto g = at::randn({6, 4});
  w.mutable_grad() = g.clone();
  alone.mutable_grad() = g.clone();
  opt.step();
  reference.step();
  EXPECT_TRUE(at::equal(w, alone));
}

TEST(Hybrid, ConvergesOnSyntheticTask) {
  auto model = make_model(12);
  MuonWithAdamWOptions options;
  options.adamw(AdamWOptions(1e-2).betas(std::make_tuple(0.9, 0.95)).weight_decay(0));
  MuonWithAdamW opt(model->named_parameters(), options);
  at::manual_seed(13);
  const auto tokens = at::randint(kVocab, {256}, at::kLong);
  const auto targets = (tokens * 7 + 3) % kVocab;  // a fixed permutation of the vocabulary
  auto loss_fn = [&] { return at::cross_entropy_loss(model->forward(tokens), targets); };
  const double initial = loss_fn().item<double>();
  double last = initial;
  for (int k = 0; k < 100; ++k) {
    last = opt.step([&] {
                muon::compat::zero_grad(opt);
                auto l = loss_fn();
                l.backward();
                return l;
              })
               .item<double>();
  }
EXPECT_LT(last, 0.1 * initial) << "initial " << initial << " final " << last;
}

TEST(Hybrid, NoMatrixOrNoVectorParameters) {
  auto only_vectors = std::make_shared<torch::nn::Module>();
  only_vectors->register_parameter("bias", at::zeros({5}));
  MuonWithAdamW a(only_vectors->named_parameters());
  EXPECT_EQ(a.muon(), nullptr);
  ASSERT_EQ(a.param_groups().size(), 1u);
  EXPECT_FALSE(a.is_muon_group(0));
  auto only_matrices = std::make_shared<torch::nn::Module>();
  only_matrices->register_parameter("w", at::randn({5, 5}));
  MuonWithAdamW b(only_matrices->named_parameters());
  EXPECT_EQ(b.adamw(), nullptr);
  only_matrices->named_parameters()["w"].mutable_grad() = at::randn({5, 5});
  b.step();
  EXPECT_EQ(b.state_bytes(), 25 * 4);
}

TEST(Hybrid, IsACompositeWithAMuonAndAnAdamWPart) {
  auto model = make_model(14);
  MuonWithAdamWOptions options;
  options.adamw_group("block.norm.*", AdamWOptions(1e-2));
  MuonWithAdamW opt(model->named_parameters(), options);
  ASSERT_EQ(opt.num_parts(), 2u);
  EXPECT_EQ(opt.part_name(0), "muon");
  EXPECT_EQ(opt.part_name(1), "adamw");
  EXPECT_EQ(&opt.part(0), opt.muon());
  EXPECT_EQ(opt.find_part("adamw"), opt.adamw());
  ASSERT_EQ(opt.param_groups().size(), 3u);
  EXPECT_EQ(opt.part_of_group(2), 1u);
  EXPECT_EQ(opt.group_names(0), (std::vector<std::string>{"block.fc1.weight", "block.fc2.weight"}));
  EXPECT_EQ(opt.group_names(2), (std::vector<std::string>{"block.norm.weight", "block.norm.bias"}));
  // Its archive is the composite's: another routing is rejected before
  // anything changes, naming the difference.
  const auto bytes = save_to_string(opt);
  auto other = make_model(14);
  MuonWithAdamWOptions moved;
  moved.routing(RoutingRules().add_override("block.fc2.weight", Route::kAdamW))
      .adamw_group("block.norm.*", AdamWOptions(1e-2));
  MuonWithAdamW different(other->named_parameters(), moved);
  different.param_groups()[0].options().set_lr(0.125);
  muon::test::expect_value_error([&] { load_from_string(different, bytes); },
                                 {"param group 0", "2 parameters", "1"});
  EXPECT_DOUBLE_EQ(different.param_groups()[0].options().get_lr(), 0.125);
}

TEST(Hybrid, NoParameterAtAll) {
  MuonWithAdamW opt(torch::OrderedDict<std::string, at::Tensor>{});
  EXPECT_EQ(opt.num_parts(), 0u);
  EXPECT_TRUE(opt.param_groups().empty());
  EXPECT_EQ(opt.muon(), nullptr);
  EXPECT_EQ(opt.adamw(), nullptr);
  opt.step();
  EXPECT_EQ(opt.state_bytes(), 0);
  MuonWithAdamW again(torch::OrderedDict<std::string, at::Tensor>{});
  load_from_string(again, save_to_string(opt));
}

}  // namespace
}  // namespace muon::test
