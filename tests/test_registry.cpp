// Tests of the optimizer registry and make_optimizer: every built-in created
// from a config and training a small model, default and user override rules,
// explain(), a user-registered optimizer end to end, save/load, schedules.
#include <gtest/gtest.h>

#include "archive_util.h"
#include "expect_util.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/symmetric.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/make.h"
#include "muon/newton_schulz.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/dion.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"
#include "muon/optim/soap.h"
#include "muon/optim/state_bytes.h"
#include "muon/registry.h"
#include "option_fields.h"
#include "tensor_util.h"

namespace muon::test {
namespace {

// A tiny language model: embedding, a fused QKV-like matrix, a norm, an MLP
// with biases and an output head.
struct TinyLmImpl : torch::nn::Module {
  TinyLmImpl(int64_t vocab, int64_t d) {
    embed = register_module("embed", torch::nn::Embedding(vocab, d));
    qkv = register_module("attn_qkv", torch::nn::Linear(torch::nn::LinearOptions(d, 3 * d).bias(false)));
    proj = register_module("attn_proj", torch::nn::Linear(torch::nn::LinearOptions(3 * d, d).bias(false)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc = register_module("fc", torch::nn::Linear(d, 2 * d));
    out = register_module("fc_out", torch::nn::Linear(2 * d, d));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(d, vocab).bias(false)));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    auto x = embed(tokens);
    x = x + proj(at::relu(qkv(x)));
    x = norm(x);
    x = x + out(at::relu(fc(x)));
    return lm_head(x);
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr}, lm_head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(TinyLm);

constexpr int64_t kVocab = 32;
constexpr int64_t kDim = 16;

TinyLm make_model(uint64_t seed) { return seeded_module<TinyLm>(seed, kVocab, kDim); }

std::map<std::string, std::string> optimizer_by_name(const std::vector<muon::ResolvedParameter>& rs) {
  std::map<std::string, std::string> out;
  for (const auto& r : rs) out[r.name] = r.optimizer;
  return out;
}

// ---- the registry ----------------------------------------------------------------

TEST(Registry, BuiltinsInOnePlace) {
  const auto keys = OptimizerRegistry::global().keys();
  for (const auto* name : {"muon", "adaptive_muon", "adam", "adamw", "sgd", "lion", "laprop", "signum",
                            "sim_ademamix", "soap", "kl_soap", "kl_m_soap", "rekls", "tp_rekls", "rekls_v3", "stacked_soap", "dion2", "nordion2", "dion", "iso", "oblique_sgd",
                            "oblique_adam", "moso", "psgd_pro", "polargrad", "scion", "mop", "spel", "muon_hyperball"}) {
    EXPECT_NE(std::find(keys.begin(), keys.end(), name), keys.end()) << name;
    EXPECT_TRUE(OptimizerRegistry::global().has(name));
  }
  const auto help = OptimizerRegistry::global().help();
  EXPECT_NE(help.find("adaptive_muon"), std::string::npos);
  expect_value_error([] { OptimizerRegistry::global().at("moun"); },
                     {"unknown optimizer 'moun'", "did you mean 'muon'",
                      "muon, adaptive_muon, adam, adamw, sgd, lion, laprop, signum, sim_ademamix, soap, "
                      "kl_soap, kl_m_soap, rekls, tp_rekls, rekls_v3, stacked_soap, dion2, nordion2, dion, iso, oblique_sgd, oblique_adam, moso, psgd_pro, polargrad, scion, mop, "
                      "spel, muon_hyperball"});
}

TEST(Registry, AddErrors) {
  OptimizerRegistry r;
  OptimizerRegistry::register_builtins(r);
  auto entry = [](std::string name) {
    OptimizerEntry e;
    e.name = std::move(name);
    e.make_options = [](const muon::OptimizerSettings& s) {
      return std::make_unique<torch::optim::SGDOptions>(s.get_double("lr"));
    };
    e.factory = [](std::vector<torch::optim::OptimizerParamGroup> g, const std::vector<muon::OptimizerSettings>&) {
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::SGD>(g, torch::optim::SGDOptions(0.1)));
    };
    return e;
  };
  expect_value_error([&] { r.add(entry("muon")); }, {"[muon::OptimizerRegistry]", "'muon' is already registered"});
  expect_value_error([&] { r.add(entry("")); }, {"needs a name"});
  auto no_factory = entry("x");
  no_factory.factory = nullptr;
  expect_value_error([&] { r.add(no_factory); }, {"'x' has no factory"});
  auto clash = entry("muon_ns");  // muon_ns + "_eps" would duplicate muon_ns_eps
  clash.fields = {muon::FieldSpec::real("eps", 1.0, "clash")};
  expect_value_error([&] { r.add(clash); }, {"'muon_ns_eps', which already exists"});
  auto bad_default = entry("y");
  bad_default.fields = {muon::FieldSpec::real("f", -1.0, "bad default", 0.0)};
  expect_value_error([&] { r.add(bad_default); }, {"f must be a double in [0, inf)", "-1"});
  auto bad_rule = entry("w");
  bad_rule.default_overrides = {OverrideRule().set("lrr", 0.1).named("typo")};
  expect_value_error([&] { r.add(bad_rule); }, {"default override 'typo' sets unknown field 'lrr'"});
  bad_rule.default_overrides = {OverrideRule().set("lr", "${optimizer}").named("ref")};
  expect_value_error([&] { r.add(bad_rule); }, {"sets lr to ${optimizer}"});
  bad_rule.default_overrides = {OverrideRule().set("muon_momentum", 2.0).named("range")};
  expect_value_error([&] { r.add(bad_rule); }, {"muon_momentum", "2"});
  auto uses_unknown = entry("z");
  uses_unknown.uses_fields_of = {"shampoo"};
  expect_value_error([&] { r.add(uses_unknown); }, {"'shampoo', which is not registered"});
  EXPECT_EQ(r.keys().size(), 29u);  // the built-ins: nothing was added
}

TEST(Registry, ExtensionsAddFieldsAndChecks) {
  // A registry of the built-ins alone has no distributed fields; the
  // distributed layer's extension adds them, in the schema's usual places.
  OptimizerRegistry r;
  OptimizerRegistry::register_builtins(r);
  EXPECT_FALSE(OptimizerConfig(r).has("layout"));
  EXPECT_FALSE(OptimizerConfig(r).has("muon_tp_mode"));
  // The built-ins' last Muon field: tp_mode goes right after it.
  const auto last_muon = "muon_" + r.option_fields("muon").back().name;
  muon::distributed::register_config_fields(r);
  EXPECT_EQ(OptimizerConfig(r).values(), OptimizerConfig().values());
  std::vector<std::string> names;
  for (const auto& f : r.fields()) names.push_back(f.name);
  auto after = [&](const std::string& a, const std::string& b) {
    const auto ia = std::find(names.begin(), names.end(), a);
    const auto ib = std::find(names.begin(), names.end(), b);
    return ia != names.end() && ib != names.end() && ia == ib + 1;
  };
  EXPECT_TRUE(after("layout", "nonfinite"));  // right after the common fields
  EXPECT_TRUE(after("muon_tp_mode", last_muon)) << last_muon;
  const auto muon_fields = r.option_fields("muon");
  EXPECT_EQ(muon_fields.back().name, "tp_mode");

  expect_value_error([&] { muon::distributed::register_config_fields(r); },
                     {"[muon::OptimizerRegistry]", "'layout'", "already exists"});
  muon::ConfigExtension unnamed;
  expect_value_error([&] { r.extend(unnamed); }, {"needs a name"});
  muon::ConfigExtension unknown;
  unknown.name = "x";
  unknown.option_fields["shampoo"] = {muon::FieldSpec::real("f", 1.0, "f")};
  expect_value_error([&] { r.extend(unknown); }, {"'shampoo', which is not registered"});
  EXPECT_EQ(r.extensions().size(), 1u);  // nothing was added

  // The check runs on param groups built by the entry's own factory only.
  muon::ConfigExtension frozen;
  frozen.name = "frozen";
  frozen.option_fields["sgd"] = {muon::FieldSpec::boolean("frozen", false, "needs another factory")};
  frozen.check_own_factory = [](const std::string&, const muon::OptimizerSettings& s) {
    TORCH_CHECK_VALUE(!s.has("frozen") || !s.get_bool("frozen"), "sgd_frozen needs a replaced factory");
  };
  r.extend(frozen);
  auto model = make_model(1);
  OptimizerConfig sgd(r);
  sgd.set("optimizer", "sgd").set("sgd_frozen", true);
  expect_value_error([&] { muon::make_optimizer(model->named_parameters(), sgd, r); },
                     {"optimizer 'sgd'", "sgd_frozen needs a replaced factory"});
  muon::BuildContext context;
  context.factories["sgd"] = r.at("sgd")->factory;
  EXPECT_EQ(muon::make_optimizer(model->named_parameters(), sgd, context, r)->part_name(0), "sgd");
}

TEST(Registry, NsComputeDtypeByName) {
  auto model = make_model(1);
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, at::ScalarType>>{
           {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float64", at::kDouble}}) {
    OptimizerConfig config;
    config.set("muon_ns_compute_dtype", name);
    auto opt = muon::make_optimizer(model->named_parameters(), config);
    const auto& o = static_cast<const muon::MuonOptions&>(opt->part(0).param_groups()[0].options());
    EXPECT_EQ(o.ns().compute_dtype(), dtype) << name;
  }
  OptimizerConfig config;
  expect_value_error([&] { config.set("muon_ns_compute_dtype", "Float"); },
                     {"muon_ns_compute_dtype must be one of", "float32", "\"Float\""});
}

// ---- every built-in trains a model ----------------------------------------------

struct Case {
  std::string optimizer;
  std::map<std::string, muon::FieldValue> fields;
  std::vector<std::string> parts;  // expected composite parts
};

class EveryBuiltin : public ::testing::TestWithParam<Case> {};

TEST_P(EveryBuiltin, CreatedFromConfigAndLowersTheLoss) {
  const auto& c = GetParam();
  auto model = make_model(5);
  OptimizerConfig config;
  config.set("optimizer", c.optimizer);
  for (const auto& [k, v] : c.fields) config.set(k, v);
  auto opt = muon::make_optimizer(model->named_parameters(), config);
  ASSERT_EQ(opt->num_parts(), c.parts.size());
  for (size_t i = 0; i < c.parts.size(); ++i) EXPECT_EQ(opt->part_name(i), c.parts[i]);

  at::manual_seed(6);
  const auto tokens = at::randint(kVocab, {128}, at::kLong);
  const auto targets = (tokens * 7 + 3) % kVocab;
  auto loss_fn = [&] { return at::cross_entropy_loss(model->forward(tokens), targets); };
  const double initial = loss_fn().item<double>();
  double last = initial;
  for (int k = 0; k < 60; ++k) {
    last = opt->step([&] {
                 muon::compat::zero_grad(*opt);
                 auto l = loss_fn();
                 l.backward();
                 return l;
               })
               .item<double>();
  }
  // Learning a fixed token permutation: every optimizer at a sane lr gets
  // well below half of the initial loss (~ln 32 ≈ 3.5) in 60 steps.
  EXPECT_LT(last, 0.5 * initial) << c.optimizer << ": initial " << initial << " final " << last;
  EXPECT_GT(opt->state_bytes(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Registry, EveryBuiltin,
    ::testing::Values(
        Case{"muon", {{"lr", 0.02}, {"muon_scale_mode", std::string("shape_scaling")}}, {"muon", "adamw"}},
        Case{"adaptive_muon", {{"lr", 0.02}, {"muon_scale_mode", std::string("shape_scaling")}}, {"adaptive_muon", "adamw"}},
        Case{"adaptive_muon",
             {{"lr", 0.01}, {"adaptive_muon_mode", std::string("adamuon")}, {"scalar_optimizer", std::string("lion")}},
             {"adaptive_muon", "lion"}},
        Case{"adamw", {{"lr", 0.01}}, {"adamw"}},
        Case{"adam", {{"lr", 0.01}}, {"adam"}},
        Case{"sgd", {{"lr", 0.2}}, {"sgd"}},
        Case{"lion", {{"lr", 0.002}}, {"lion"}},
        Case{"laprop", {{"lr", 0.01}}, {"laprop"}},
        Case{"signum", {{"lr", 0.003}}, {"signum"}},
        Case{"sim_ademamix", {{"lr", 0.003}}, {"sim_ademamix"}},
        Case{"soap", {{"lr", 0.01}}, {"adamw", "soap"}},
        Case{"kl_soap", {{"lr", 0.01}}, {"adamw", "kl_soap"}},
        Case{"kl_m_soap", {{"lr", 0.01}}, {"adamw", "kl_m_soap"}},
        Case{"rekls", {{"lr", 0.01}}, {"adamw", "rekls"}},
        Case{"tp_rekls", {{"lr", 0.01}}, {"adamw", "tp_rekls"}},
        Case{"rekls_v3", {{"lr", 0.01}}, {"adamw", "rekls_v3"}},
        Case{"stacked_soap", {{"lr", 0.01}}, {"adamw", "stacked_soap"}},
        Case{"dion2", {{"lr", 0.01}}, {"adamw", "dion2"}},
        Case{"nordion2", {{"lr", 0.01}}, {"adamw", "nordion2"}},
        Case{"dion", {{"lr", 0.01}}, {"adamw", "dion"}},
        Case{"iso", {{"lr", 0.01}, {"weight_decay", 0.0}}, {"adamw", "iso"}},
        Case{"oblique_sgd", {{"lr", 0.05}}, {"adamw", "oblique_sgd"}},
        Case{"oblique_adam", {{"lr", 0.01}}, {"adamw", "oblique_adam"}},
        Case{"moso", {{"lr", 0.01}}, {"adamw", "moso"}},
        Case{"psgd_pro", {{"lr", 0.01}}, {"adamw", "psgd_pro"}},
        Case{"polargrad", {{"lr", 0.005}}, {"adamw", "polargrad"}},
        Case{"scion", {{"lr", 0.02}, {"scion_spectral_radius", 3.0}}, {"adamw", "scion"}},
        Case{"mop", {{"lr", 0.01}}, {"adamw", "mop"}},
        Case{"spel", {{"lr", 0.02}}, {"adamw", "spel"}},
        Case{"muon_hyperball", {{"lr", 0.02}}, {"adamw", "muon_hyperball"}}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.optimizer + "_" + std::to_string(info.index);
    });

// ---- resolution and overrides ---------------------------------------------------

TEST(Registry, MuonDefaultsSendScalarsEmbeddingsAndHeadToTheScalarOptimizer) {
  auto model = make_model(1);
  OptimizerConfig config;
  const auto resolved = muon::resolve_parameters(model->named_parameters(), config);
  const auto by_name = optimizer_by_name(resolved);
  EXPECT_EQ(by_name.at("embed.weight"), "adamw");
  EXPECT_EQ(by_name.at("lm_head.weight"), "adamw");
  EXPECT_EQ(by_name.at("norm.weight"), "adamw");
  EXPECT_EQ(by_name.at("fc.bias"), "adamw");
  EXPECT_EQ(by_name.at("attn_qkv.weight"), "muon");
  EXPECT_EQ(by_name.at("fc_out.weight"), "muon");

  config.set("scalar_optimizer", "lion");
  // A user rule may use the same reference.
  config.add_override(OverrideRule().match_name("fc_out.weight").set("optimizer", "${scalar_optimizer}"));
  EXPECT_EQ(optimizer_by_name(muon::resolve_parameters(model->named_parameters(), config)).at("fc_out.weight"),
            "lion");
  auto opt = muon::make_optimizer(model->named_parameters(), config);
  ASSERT_EQ(opt->num_parts(), 2u);
  EXPECT_NE(dynamic_cast<muon::Muon*>(opt->find_part("muon")), nullptr);
  EXPECT_NE(dynamic_cast<muon::Lion*>(opt->find_part("lion")), nullptr);
  // Identical settings share a group: one Muon group, one Lion group.
  EXPECT_EQ(opt->param_groups().size(), 2u);
}

TEST(Registry, LaterRulesWinAndSeeTheOptimizerChosenBefore) {
  auto model = make_model(1);
  OptimizerConfig config;
  config.set("lr", 0.02);
  config.add_override(OverrideRule().match_name("attn_*").set("lr", 0.01).named("attention"));
  config.add_override(OverrideRule().match_regex("attn_proj\\.weight").set("lr", 0.005).named("proj"));
  config.add_override(OverrideRule().match_optimizer("adamw").set("lr", 3e-4).named("scalars"));
  config.add_override(OverrideRule().match_bias().set("weight_decay", 0.0).set("optimizer", "sgd").named("biases"));
  config.add_override(OverrideRule().match_ndim(2).match_shape({kDim, 2 * kDim}).set("muon_momentum", 0.9));
  const auto resolved = muon::resolve_parameters(model->named_parameters(), config);
  std::map<std::string, const muon::ResolvedParameter*> r;
  for (const auto& p : resolved) r[p.name] = &p;
  auto lr = [&](const std::string& n) { return std::get<double>(r.at(n)->values.at("lr")); };
  EXPECT_DOUBLE_EQ(lr("attn_qkv.weight"), 0.01);
  EXPECT_DOUBLE_EQ(lr("attn_proj.weight"), 0.005);  // both attention rules match; the later wins
  EXPECT_DOUBLE_EQ(lr("fc.weight"), 0.02);
  EXPECT_DOUBLE_EQ(lr("embed.weight"), 3e-4);  // sent to adamw by a default rule, then "scalars"
  EXPECT_EQ(r.at("fc.bias")->optimizer, "sgd");  // "scalars" then "biases"
  EXPECT_DOUBLE_EQ(lr("fc.bias"), 3e-4);
  EXPECT_EQ(r.at("fc.bias")->rules, (std::vector<std::string>{"muon default: ndim < 2", "scalars", "biases"}));
  EXPECT_DOUBLE_EQ(std::get<double>(r.at("fc_out.weight")->values.at("muon_momentum")), 0.9);
  EXPECT_DOUBLE_EQ(std::get<double>(r.at("fc.weight")->values.at("muon_momentum")), 0.95);

  auto opt = muon::make_optimizer(model->named_parameters(), config);
  ASSERT_EQ(opt->num_parts(), 3u);  // muon, adamw, sgd in registry order
  EXPECT_EQ(opt->part_name(2), "sgd");
  // Muon groups: qkv (0.01), proj (0.005), fc (0.02), fc_out (0.02, momentum 0.9).
  auto& muon_part = opt->part(0);
  ASSERT_EQ(muon_part.param_groups().size(), 4u);
  EXPECT_DOUBLE_EQ(static_cast<const muon::MuonOptions&>(muon_part.param_groups()[3].options()).momentum(), 0.9);
  EXPECT_EQ(opt->param_groups().size(), 4u + 1u + 1u);
  // Each parameter is in the composite group that explain() and resolve report.
  auto named = model->named_parameters();
  for (const auto& name : {"attn_qkv.weight", "attn_proj.weight", "fc.weight", "fc_out.weight",
                           "embed.weight", "fc.bias", "fc_out.bias"}) {
    const auto* p = named.find(name);
    ASSERT_NE(p, nullptr);
    int64_t found = -1;
    for (size_t g = 0; g < opt->param_groups().size(); ++g) {
      for (const auto& t : opt->param_groups()[g].params()) {
        if (t.is_same(*p)) found = static_cast<int64_t>(g);
      }
    }
    EXPECT_EQ(found, r.at(name)->group) << name;
  }
}

TEST(Registry, RuleMatchingNothingIsAnError) {
  auto model = make_model(1);
  OptimizerConfig config;
  config.add_override(OverrideRule().match_name("*.qkv.weight").set("lr", 0.1).named("qkv"));
  expect_value_error([&] { muon::make_optimizer(model->named_parameters(), config); },
                     {"[muon::make_optimizer]", "override 'qkv'", "name '*.qkv.weight'", "matches no parameter"});
}

TEST(Registry, SplitQkvThroughAnOverride) {
  auto model = make_model(1);
  OptimizerConfig config;
  config.set("muon_qkv_split_sizes", std::vector<int64_t>{4, 2, 2}).set("muon_num_query_groups", 6);
  config.add_override(OverrideRule().match_name("attn_qkv.weight").set("muon_split_qkv", true));
  auto opt = muon::make_optimizer(model->named_parameters(), config);
  const auto& g = opt->part(0).param_groups()[0];
  EXPECT_EQ(g.params()[0].sizes(), model->qkv->weight.sizes());
  const auto& o = static_cast<const muon::MuonOptions&>(g.options());
  EXPECT_EQ(o.split_sizes(), (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(o.num_query_groups(), 6);
  // Other matrices are not split.
  EXPECT_TRUE(static_cast<const muon::MuonOptions&>(opt->part(0).param_groups()[1].options()).split_sizes().empty());
  // A split that does not fit the matrix is Muon's own error, with context.
  config.set("muon_num_query_groups", 5);
  expect_value_error([&] { muon::make_optimizer(model->named_parameters(), config); },
                     {"[muon::make_optimizer]", "optimizer 'muon'", "split_sizes"});
}

TEST(Registry, InvalidSettingsAndTensorParallelModes) {
  auto model = make_model(1);
  OptimizerConfig config;
  config.set("muon_tp_mode", "distributed");
  expect_value_error([&] { muon::make_optimizer(model->named_parameters(), config); },
                     {"optimizer 'muon'", "attn_qkv.weight", "muon_tp_mode 'distributed'"});
  OptimizerConfig sgd;
  sgd.set("optimizer", "sgd").set("sgd_nesterov", true).set("sgd_momentum", 0.0);
  expect_value_error([&] { muon::make_optimizer(model->named_parameters(), sgd); },
                     {"sgd_nesterov needs sgd_momentum > 0", "momentum 0"});
  OptimizerConfig to_muon;  // a 1-D parameter sent to Muon by a user rule
  to_muon.add_override(OverrideRule().match_name("fc.bias").set("optimizer", "muon"));
  expect_value_error([&] { muon::make_optimizer(model->named_parameters(), to_muon); },
                     {"optimizer 'muon'", "ndim 1"});
}

TEST(Registry, ExplainShowsEveryParameter) {
  auto model = make_model(1);
  OptimizerConfig config;
  config.set("lr", 0.02);
  config.add_override(OverrideRule().match_name("attn_*").set("lr", 0.01).set("muon_momentum", 0.9).named("attention"));
  const auto text = muon::explain(model->named_parameters(), config);
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  // Header, one line per parameter, the state of each optimizer in use
  // (adamw for the embedding, the first parameter, then muon: their state
  // schemas), and what Newton–Schulz in fp32 (the config's compute dtype)
  // runs on on this CPU.
  ASSERT_EQ(lines.size(), model->named_parameters().size() + 4);
  EXPECT_EQ(lines[lines.size() - 3],
            "state of adamw: step [counter], exp_avg [param, zeros, rows], exp_avg_sq [param, zeros, rows], "
            "max_exp_avg_sq [param, zeros, rows, optional]");
  EXPECT_EQ(lines[lines.size() - 2], "state of muon: step [counter], momentum_buffer [param, zeros, rows]");
  EXPECT_EQ(lines[0].rfind("parameter", 0), 0u);
  EXPECT_EQ(lines.back(), "Newton–Schulz in float32: " + muon::newton_schulz_cpu_kernels(at::kFloat));
  EXPECT_NE(lines.back().find("fp32 products: "), std::string::npos) << lines.back();
  // A bf16 compute dtype says which bf16 products this CPU has.
  config.set("muon_ns_compute_dtype", std::string("bfloat16"));
  const auto bf16 = muon::explain(model->named_parameters(), config);
  EXPECT_NE(bf16.find("Newton–Schulz in bfloat16: " + muon::newton_schulz_cpu_kernels(at::kBFloat16)),
            std::string::npos)
      << bf16;
  EXPECT_NE(bf16.find(muon::detail::bf16_products() == muon::detail::Bf16Products::kOneDnn
                          ? "oneDNN bf16 matmul"
                          : "widened to fp32"),
            std::string::npos)
      << bf16;
  auto line_of = [&](const std::string& name) {
    for (const auto& l : lines) {
      if (l.rfind(name + " ", 0) == 0) return l;
    }
    return std::string();
  };
  const auto qkv = line_of("attn_qkv.weight");
  EXPECT_NE(qkv.find("[48, 16]"), std::string::npos) << qkv;
  EXPECT_NE(qkv.find("muon"), std::string::npos) << qkv;
  EXPECT_NE(qkv.find("lr=0.01"), std::string::npos) << qkv;
  EXPECT_NE(qkv.find("momentum=0.9"), std::string::npos) << qkv;
  EXPECT_NE(qkv.find("[attention]"), std::string::npos) << qkv;
  const auto fc = line_of("fc.weight");
  EXPECT_NE(fc.find("lr=0.02"), std::string::npos) << fc;
  EXPECT_EQ(fc.find("momentum="), std::string::npos) << fc;  // not different from the config
  const auto bias = line_of("fc.bias");
  EXPECT_NE(bias.find("adamw"), std::string::npos) << bias;
  EXPECT_NE(bias.find("[muon default: ndim < 2]"), std::string::npos) << bias;
}

TEST(Registry, TiedWeightsAreOptimizedOnce) {
  auto model = make_model(1);
  model->lm_head->weight = model->embed->weight;  // tie
  torch::OrderedDict<std::string, at::Tensor> named;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) named.insert(item.key(), item.value());
  named.insert("tied_head.weight", model->embed->weight);
  OptimizerConfig config;
  const auto resolved = muon::resolve_parameters(named, config);
  EXPECT_EQ(resolved.back().alias_of, "embed.weight");
  auto opt = muon::make_optimizer(named, config);
  size_t count = 0;
  for (const auto& g : opt->param_groups()) count += g.params().size();
  EXPECT_EQ(count, named.size() - 1);
  EXPECT_NE(muon::explain(named, config).find("same tensor as 'embed.weight'"), std::string::npos);
}

// ---- save/load and schedules through make_optimizer ------------------------------

TEST(Registry, ResumedRunIsBitIdentical) {
  OptimizerConfig config;
  config.set("lr", 0.02).set("scalar_optimizer", "lion");
  config.add_override(OverrideRule().match_name("attn_*").set("lr", 0.01));
  at::manual_seed(9);
  const auto tokens = at::randint(kVocab, {64}, at::kLong);
  const auto targets = (tokens * 5 + 1) % kVocab;
  auto train = [&](TinyLm& model, torch::optim::Optimizer& opt, int steps) {
    for (int i = 0; i < steps; ++i) {
      muon::compat::zero_grad(opt);
      at::cross_entropy_loss(model->forward(tokens), targets).backward();
      opt.step();
    }
  };
  auto a = make_model(3);
  auto straight = muon::make_optimizer(a->named_parameters(), config);
  train(a, *straight, 6);

  auto b = make_model(3);
  auto first = muon::make_optimizer(b->named_parameters(), config);
  train(b, *first, 3);
  first->param_groups()[0].options().set_lr(0.01);  // an lr set by a schedule survives the archive
  straight->param_groups()[0].options().set_lr(0.01);
  const auto bytes = save_to_string(*first);
  auto c = make_model(4);
  {
    at::NoGradGuard no_grad;
    auto src = b->named_parameters();
    for (auto& item : c->named_parameters()) item.value().copy_(src[item.key()]);
  }
  auto second = muon::make_optimizer(c->named_parameters(), config);
  load_from_string(*second, bytes);
  EXPECT_DOUBLE_EQ(second->param_groups()[0].options().get_lr(), 0.01);
  train(b, *first, 3);
  train(c, *second, 3);
  auto pb = b->named_parameters();
  for (const auto& item : c->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
  }

  // A config that groups differently does not load it.
  OptimizerConfig other = config;
  other.clear_overrides();
  auto d = make_model(3);
  auto third = muon::make_optimizer(d->named_parameters(), other);
  EXPECT_THROW(load_from_string(*third, bytes), c10::ValueError);
}

TEST(Registry, ScheduleFromConfigScalesEveryGroup) {
  auto model = make_model(1);
  OptimizerConfig config;
  config.set("lr", 0.02).set("min_lr", 0.002).set("lr_warmup_steps", 10).set("lr_decay_steps", 110)
      .set("lr_decay_style", "cosine");
  config.add_override(OverrideRule().match_optimizer("adamw").set("lr", 0.001));
  auto opt = muon::make_optimizer(model->named_parameters(), config);
  muon::WarmupDecaySchedule sched(*opt, muon::lr_schedule_options(config));
  for (int i = 0; i < 10; ++i) sched.step();
  EXPECT_NEAR(opt->param_groups()[0].options().get_lr(), 0.02, 1e-15);
  EXPECT_NEAR(opt->param_groups()[1].options().get_lr(), 0.001, 1e-15);
  sched.set_step(110);
  EXPECT_NEAR(opt->param_groups()[0].options().get_lr(), 0.002, 1e-15);
  EXPECT_NEAR(opt->param_groups()[1].options().get_lr(), 0.0001, 1e-15);
  // The composite hands the scheduled lr to the inner optimizers at each step.
  opt->step();
  EXPECT_NEAR(opt->part(1).param_groups()[0].options().get_lr(), 0.0001, 1e-15);
}

// ---- a user-registered optimizer ---------------------------------------------------

// SGD on the sign of the gradient, scaled by a factor: p ← p − lr·factor·sign(g).
struct SignSgdOptions : public torch::optim::OptimizerCloneableOptions<SignSgdOptions> {
  explicit SignSgdOptions(double lr = 0.01) : lr_(lr) {}
  TORCH_ARG(double, lr) = 0.01;
  TORCH_ARG(double, factor) = 1.0;

 public:
  void serialize(torch::serialize::InputArchive& a) override {
    c10::IValue v;
    a.read("lr", v);
    lr_ = v.toDouble();
    a.read("factor", v);
    factor_ = v.toDouble();
  }
  void serialize(torch::serialize::OutputArchive& a) const override {
    a.write("lr", c10::IValue(lr_));
    a.write("factor", c10::IValue(factor_));
  }
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }
};

class SignSgd : public torch::optim::Optimizer, public muon::StateBytes {
 public:
  int64_t state_bytes() const override { return 42; }
  SignSgd(std::vector<torch::optim::OptimizerParamGroup> groups, SignSgdOptions defaults)
      : Optimizer(groups, std::make_unique<SignSgdOptions>(defaults)) {
    muon::compat::reapply_group_options(*this, groups);
  }
  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode enable(true);
      loss = closure();
    }
    for (auto& g : param_groups_) {
      const auto& o = static_cast<const SignSgdOptions&>(g.options());
      for (auto& p : g.params()) {
        if (p.grad().defined()) p.add_(p.grad().sign(), -o.lr() * o.factor());
      }
    }
    return loss;
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
  bool initialized = false;
};

TEST(Registry, UserRegisteredOptimizerEndToEnd) {
  OptimizerEntry e;
  e.name = "test_sign_sgd";
  e.doc = "sign SGD (test)";
  e.fields = {muon::FieldSpec::real("factor", 1.0, "step multiplier", 0.0).exclusive_min()};
  e.make_options = [](const muon::OptimizerSettings& s) {
    auto o = std::make_unique<SignSgdOptions>(s.get_double("lr"));
    o->factor(s.get_double("factor"));  // from config field test_sign_sgd_factor, prefix stripped
    return o;
  };
  e.factory = [](std::vector<torch::optim::OptimizerParamGroup> groups, const std::vector<muon::OptimizerSettings>&) {
    const auto defaults = static_cast<const SignSgdOptions&>(groups.at(0).options());
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<SignSgd>(std::move(groups), defaults));
  };
  e.default_overrides = {OverrideRule().match_embedding().set("lr", 0.0).named("frozen embeddings")};
  e.init_state = [](torch::optim::Optimizer& opt) { static_cast<SignSgd&>(opt).initialized = true; };
  OptimizerRegistry::global().add(e);
  expect_value_error([&] { OptimizerRegistry::global().add(e); }, {"'test_sign_sgd' is already registered"});

  // Its field exists in configs made from now on, as a JSON key and a flag.
  OptimizerConfig config;
  ASSERT_TRUE(config.has("test_sign_sgd_factor"));
  muon::apply_config_json(config, R"({"optimizer": "test_sign_sgd", "lr": 0.01})");
  ASSERT_TRUE(muon::parse_config_flags(config, {"--test-sign-sgd-factor", "2"}));
  expect_value_error([&] { config.set("test_sign_sgd_factor", 0.0); }, {"test_sign_sgd_factor", "(0, inf)", "0"});

  auto model = make_model(2);
  const auto embed0 = model->embed->weight.detach().clone();
  const auto fc0 = model->fc->weight.detach().clone();
  auto opt = muon::make_optimizer(model->named_parameters(), config);
  ASSERT_EQ(opt->num_parts(), 1u);
  EXPECT_TRUE(static_cast<SignSgd&>(opt->part(0)).initialized);
  EXPECT_EQ(opt->state_bytes(), 42);
  at::manual_seed(3);
  const auto tokens = at::randint(kVocab, {64}, at::kLong);
  at::cross_entropy_loss(model->forward(tokens), tokens).backward();
  opt->step();
  EXPECT_TRUE(at::equal(model->embed->weight.detach(), embed0));  // the entry's default rule
  const auto moved = (model->fc->weight.detach() - fc0).abs();
  // lr 0.01 × factor 2; the difference of fp32 values near 0.25 is exact to ~3e-8.
  EXPECT_NEAR(moved.max().item<double>(), 0.02, 1e-7);
  EXPECT_NE(muon::explain(model->named_parameters(), config).find("[frozen embeddings]"), std::string::npos);
}

// The typed option fields (src/option_fields.h): one line declares a field's
// spec and how its value enters the options; the entry's fields and
// make_options come from the same list.
TEST(OptionFields, EntryDeclaresAndReadsTheSameFields) {
  using O = LionOptions;
  using F = detail::OptionFields<O>;
  const auto e = detail::options_entry<Lion, O>(
      "lion_like", StateSchema(), "a Lion",
      {F::real("beta1", &O::beta1, 0.8, "b1", 0.0, 1.0).exclusive_max(),
       F::real("beta2", &O::beta2, 0.9, "b2", 0.0, 1.0), F::common("weight_decay", &O::weight_decay)});
  ASSERT_EQ(e.fields.size(), 2u);  // weight_decay is read, not declared
  EXPECT_EQ(e.fields[0].name, "beta1");
  EXPECT_EQ(std::get<double>(e.fields[0].default_value), 0.8);
  EXPECT_TRUE(e.fields[0].max_exclusive);
  EXPECT_FALSE(e.fields[1].max_exclusive);
  const OptimizerSettings s({{"lr", 0.5}, {"beta1", 0.25}, {"beta2", 0.75}, {"weight_decay", 0.125}});
  const auto o = e.make_options(s);
  const auto& lion = static_cast<const O&>(*o);
  EXPECT_EQ(lion.lr(), 0.5);
  EXPECT_EQ(lion.beta1(), 0.25);
  EXPECT_EQ(lion.beta2(), 0.75);
  EXPECT_EQ(lion.weight_decay(), 0.125);
  // Options' own validate runs after the fields.
  const OptimizerSettings bad({{"lr", 0.5}, {"beta1", 1.5}, {"beta2", 0.75}, {"weight_decay", 0.0}});
  EXPECT_THROW(e.make_options(bad), c10::ValueError);
}

// A field made without a default takes its options' own: the field of that
// name in kFields, read from Options() (listed_default). A name not listed,
// or listed with another type, raises rather than inventing a default.
TEST(OptionFields, WithoutADefaultTheOptionsOwnByName) {
  using L = detail::OptionFields<LionOptions>;
  const auto beta2 = L::real("beta2", &LionOptions::beta2, "b2", 0.0, 1.0);
  EXPECT_EQ(std::get<double>(beta2.spec.default_value), LionOptions().beta2());
  EXPECT_EQ(beta2.spec.min, 0.0);
  using S = detail::OptionFields<SoapOptions>;
  EXPECT_EQ(std::get<int64_t>(
                S::integer("precondition_frequency", &SoapOptions::precondition_frequency, "f").spec.default_value),
            SoapOptions().precondition_frequency());
  EXPECT_EQ(std::get<bool>(S::boolean("use_nesterov", &SoapOptions::use_nesterov, "n").spec.default_value),
            SoapOptions().use_nesterov());
  using D = detail::OptionFields<DionOptions>;
  const auto qr = D::text("qr_method", &DionOptions::qr_method, "q", {"rcqr", "qr", "other"});
  EXPECT_EQ(std::get<std::string>(qr.spec.default_value), DionOptions().qr_method());
  // Read from the settings as a field with an explicit default is.
  LionOptions o;
  beta2.apply(o, OptimizerSettings({{"beta2", 0.5}}));
  EXPECT_EQ(o.beta2(), 0.5);
  const auto unknown = error_of<c10::Error>([] { L::real("beta3", &LionOptions::beta2, "b3"); });
  EXPECT_NE(unknown.find("'beta3' is not a listed field"), std::string::npos) << unknown;
  const auto mistyped = error_of<c10::Error>([] { detail::listed_default<int64_t, LionOptions>("beta1"); });
  EXPECT_NE(mistyped.find("'beta1' is not a listed field"), std::string::npos) << mistyped;
}

}  // namespace
}  // namespace muon::test
