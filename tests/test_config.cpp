// Tests of muon::OptimizerConfig: the schema, set/get, override rules, JSON
// and command-line flags, with every error naming the key and the value.
#include <gtest/gtest.h>

#include "expect_util.h"

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "muon/config.h"
#include "muon/optim/muon.h"
#include "muon/registry.h"

namespace {

using muon::test::expect_value_error;

using muon::FieldValue;
using muon::OptimizerConfig;
using muon::OverrideRule;

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

// ---- schema and values ----------------------------------------------------------

TEST(Config, FromASchema) {
  // A config knows only its schema; the registry's constructors give it one.
  EXPECT_EQ(OptimizerConfig(muon::OptimizerRegistry::global().fields()).values(), OptimizerConfig().values());
  const OptimizerConfig small(std::vector<muon::FieldSpec>{muon::FieldSpec::real("lr", 0.1, "lr", 0.0)});
  EXPECT_EQ(small.fields().size(), 1u);
  EXPECT_DOUBLE_EQ(small.get_double("lr"), 0.1);
  expect_value_error([] { OptimizerConfig(std::vector<muon::FieldSpec>{muon::FieldSpec::real("a", 1.0, "a"),
                                                                       muon::FieldSpec::real("a", 2.0, "a")}); },
                     {"[muon::OptimizerConfig]", "'a' twice"});
  expect_value_error([] { OptimizerConfig(std::vector<muon::FieldSpec>{muon::FieldSpec::real("", 1.0, "")}); },
                     {"schema field 0 has no name"});
}

TEST(Config, CommonAndPrefixedFieldsWithDefaults) {
  OptimizerConfig c;
  EXPECT_EQ(c.fields().front().name, "optimizer");
  EXPECT_EQ(c.get_string("optimizer"), "muon");
  EXPECT_EQ(c.get_string("scalar_optimizer"), "adamw");
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 3e-4);
  EXPECT_DOUBLE_EQ(c.get_double("muon_momentum"), 0.95);
  EXPECT_TRUE(c.get_bool("muon_nesterov"));
  EXPECT_EQ(c.get_string("muon_coefficient_type"), "quintic");
  EXPECT_EQ(c.get_string("muon_scale_mode"), "spectral");
  EXPECT_EQ(c.get_string("muon_tp_mode"), "duplicated");
  EXPECT_TRUE(c.get_int_list("muon_qkv_split_sizes").empty());
  EXPECT_DOUBLE_EQ(c.get_double("adam_beta2"), 0.95);
  EXPECT_DOUBLE_EQ(c.get_double("lion_beta2"), 0.99);
  EXPECT_EQ(c.get_string("adaptive_muon_mode"), "normuon");
  for (const auto* key : {"min_lr", "weight_decay", "lr_warmup_steps", "lr_decay_style", "adam_beta1",
                          "adam_eps", "muon_num_ns_steps", "muon_extra_scale_factor", "muon_split_qkv",
                          "sgd_momentum", "adaptive_muon_beta2"}) {
    EXPECT_TRUE(c.has(key)) << key;
  }
}

TEST(Config, MuonDefaultsAreMuonOptionsDefaults) {
  // Every muon_* default but the scale mode (paired with the common lr,
  // docs/config.md) is MuonOptions' own.
  OptimizerConfig c;
  const muon::MuonOptions d;
  EXPECT_DOUBLE_EQ(c.get_double("muon_momentum"), d.momentum());
  EXPECT_EQ(c.get_bool("muon_nesterov"), d.nesterov());
  EXPECT_EQ(c.get_string("muon_momentum_style"), muon::to_string(d.momentum_style()));
  EXPECT_EQ(c.get_string("muon_weight_decay_mode"), muon::to_string(d.weight_decay_mode()));
  EXPECT_EQ(c.get_string("muon_coefficient_type"), d.ns().coefficients().name);
  EXPECT_DOUBLE_EQ(c.get_double("muon_ns_eps"), d.ns().eps());
  EXPECT_EQ(c.get_string("muon_ns_compute_dtype"), "float32");
  EXPECT_EQ(d.ns().compute_dtype(), at::kFloat);
  EXPECT_DOUBLE_EQ(c.get_double("muon_extra_scale_factor"), d.extra_scale_factor());
  EXPECT_EQ(c.get_bool("muon_stacked_experts"), d.stacked_experts());
  EXPECT_EQ(c.get_int("muon_num_query_groups"), d.num_query_groups());
  EXPECT_EQ(c.get_int_list("muon_qkv_split_sizes"), d.split_sizes());
  EXPECT_EQ(d.scale_mode(), muon::ScaleMode::kShapeScaling);
  EXPECT_DOUBLE_EQ(d.lr(), muon::kDefaultMuonLr);
}

TEST(Config, SetChecksTypeAndRange) {
  OptimizerConfig c;
  c.set("lr", 0.02).set("muon_num_ns_steps", 7).set("muon_nesterov", false).set("optimizer", "lion");
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 0.02);
  EXPECT_EQ(c.get_int("muon_num_ns_steps"), 7);
  EXPECT_FALSE(c.get_bool("muon_nesterov"));
  c.set("lr", 1);  // an int is a valid double
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 1.0);
  c.set("muon_qkv_split_sizes", std::vector<int64_t>{4, 2, 2});
  EXPECT_EQ(c.get_int_list("muon_qkv_split_sizes"), (std::vector<int64_t>{4, 2, 2}));

  expect_value_error([&] { c.set("mun_momentum", 0.9); },
                     {"[muon::OptimizerConfig]", "unknown field 'mun_momentum'", "did you mean 'muon_momentum'"});
  expect_value_error([&] { c.set("lr", "fast"); }, {"lr must be a double", "\"fast\"", "(string)"});
  expect_value_error([&] { c.set("lr", -0.1); }, {"lr must be a double in [0, inf)", "-0.1"});
  expect_value_error([&] { c.set("muon_momentum", 1.0); }, {"muon_momentum", "[0, 1)", "got 1"});
  expect_value_error([&] { c.set("muon_num_ns_steps", 0.5); }, {"muon_num_ns_steps must be an int", "0.5"});
  expect_value_error([&] { c.set("muon_num_ns_steps", 100); }, {"muon_num_ns_steps", "[0, 99]", "100"});
  expect_value_error([&] { c.set("muon_scale_mode", "spectrl"); },
                     {"muon_scale_mode must be one of", "\"spectrl\"", "did you mean 'spectral'"});
  expect_value_error([&] { c.set("optimizer", "muom"); }, {"optimizer", "did you mean 'muon'", "lion"});
  expect_value_error([&] { c.set("muon_qkv_split_sizes", std::vector<int64_t>{4, 0}); },
                     {"muon_qkv_split_sizes", "[4, 0]"});
  expect_value_error([&] { c.set("lr", std::nan("")); }, {"lr", "nan"});
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 1.0);  // failed sets change nothing
  expect_value_error([&] { c.get_int("lr"); }, {"lr is a double, not a int"});
}

TEST(Config, SetFromString) {
  OptimizerConfig c;
  c.set_from_string("lr", "0.01").set_from_string("muon_nesterov", "no");
  c.set_from_string("muon_qkv_split_sizes", "4,2,2");
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 0.01);
  EXPECT_FALSE(c.get_bool("muon_nesterov"));
  EXPECT_EQ(c.get_int_list("muon_qkv_split_sizes"), (std::vector<int64_t>{4, 2, 2}));
  c.set_from_string("muon_qkv_split_sizes", "[8, 1]");
  EXPECT_EQ(c.get_int_list("muon_qkv_split_sizes"), (std::vector<int64_t>{8, 1}));
  expect_value_error([&] { c.set_from_string("lr", "0.01x"); }, {"lr must be a double", "'0.01x'"});
  expect_value_error([&] { c.set_from_string("muon_nesterov", "maybe"); }, {"muon_nesterov must be a bool", "'maybe'"});
  expect_value_error([&] { c.set_from_string("muon_num_ns_steps", "5.5"); }, {"muon_num_ns_steps must be an int", "'5.5'"});
  expect_value_error([&] { c.set_from_string("muon_qkv_split_sizes", "4,x"); }, {"muon_qkv_split_sizes", "'4,x'"});
}

TEST(Config, NearestName) {
  EXPECT_EQ(muon::nearest_name("muon-momentum", {"lr", "muon_momentum", "muon_nesterov"}), "muon_momentum");
  EXPECT_EQ(muon::nearest_name("adamw_beta1", {"adam_beta1", "lion_beta1"}), "adam_beta1");
  EXPECT_EQ(muon::nearest_name("x", {}), "");
}

// ---- override rules -------------------------------------------------------------

TEST(Config, OverrideRulesAreCheckedWhenAdded) {
  OptimizerConfig c;
  c.add_override(OverrideRule().match_name("*.bias").set("weight_decay", 0.0));
  c.add_override(OverrideRule().match_regex("layers\\.[0-9]+\\.qkv\\.weight").set("lr", 0.01).named("qkv"));
  ASSERT_EQ(c.overrides().size(), 2u);
  EXPECT_EQ(c.overrides()[0].label, "rule 1");
  EXPECT_EQ(c.overrides()[1].label, "qkv");
  expect_value_error([&] { c.add_override(OverrideRule().set("lrr", 0.1)); }, {"unknown field 'lrr'", "did you mean 'lr'"});
  expect_value_error([&] { c.add_override(OverrideRule().set("lr", "x")); }, {"lr must be a double", "\"x\""});
  expect_value_error([&] { c.add_override(OverrideRule().set("lr_warmup_steps", 10)); },
                     {"rule 3", "lr_warmup_steps", "whole-run"});
  expect_value_error([&] { c.add_override(OverrideRule().set("adaptive_muon_beta2", 0.9)); },
                     {"adaptive_muon_beta2", "whole-run"});
  expect_value_error([&] { c.add_override(OverrideRule().match_regex("(").set("lr", 0.1)); }, {"invalid regex '('"});
  expect_value_error([&] { c.add_override(OverrideRule().set("lr", "${optimizer}")); }, {"lr (double)", "${optimizer} (string)"});
  expect_value_error([&] { c.add_override(OverrideRule().match_optimizer("adamww").set("lr", 0.1)); }, {"adamww", "did you mean 'adamw'"});
  expect_value_error([&] { c.add_override(OverrideRule().match_ndim(1)); }, {"sets no field"});
  EXPECT_EQ(c.overrides().size(), 2u);
}

// ---- JSON -----------------------------------------------------------------------

TEST(Config, Json) {
  OptimizerConfig c;
  muon::apply_config_json(c, R"({
    "optimizer": "adaptive_muon", "lr": 0.02, "muon_momentum": 0.9, "muon_nesterov": false,
    "muon_qkv_split_sizes": [4, 2, 2], "adaptive_muon_mode": "adamuon", "lr_warmup_steps": 10,
    "overrides": [
      {"match": {"name": "*.qkv.weight", "ndim": 2}, "set": {"muon_split_qkv": true}, "label": "qkv"},
      {"match": {"is_bias": true, "shape": [16]}, "set": {"weight_decay": 0, "optimizer": "lion"}}
    ]})");
  EXPECT_EQ(c.get_string("optimizer"), "adaptive_muon");
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 0.02);
  EXPECT_DOUBLE_EQ(c.get_double("muon_momentum"), 0.9);
  EXPECT_FALSE(c.get_bool("muon_nesterov"));
  EXPECT_EQ(c.get_int("lr_warmup_steps"), 10);
  ASSERT_EQ(c.overrides().size(), 2u);
  EXPECT_EQ(c.overrides()[0].label, "qkv");
  EXPECT_EQ(*c.overrides()[0].match.name, "*.qkv.weight");
  EXPECT_EQ(*c.overrides()[1].match.shape, std::vector<int64_t>{16});
  EXPECT_DOUBLE_EQ(std::get<double>(c.overrides()[1].set_fields.at("weight_decay")), 0.0);  // int 0 → double

  // Round trip through to_json.
  OptimizerConfig d;
  muon::apply_config_json(d, c.to_json());
  EXPECT_EQ(d.values(), c.values());
  ASSERT_EQ(d.overrides().size(), 2u);
  EXPECT_EQ(d.overrides()[1].match.describe(), c.overrides()[1].match.describe());
}

TEST(Config, JsonErrorsNameKeyAndValueAndChangeNothing) {
  OptimizerConfig c;
  auto apply = [&](const std::string& text) { return [&c, text] { muon::apply_config_json(c, text); }; };
  expect_value_error(apply(R"({"lr": 0.1, "muon_momentun": 0.9})"), {"unknown key 'muon_momentun'", "did you mean 'muon_momentum'"});
  expect_value_error(apply(R"({"lr": "0.1"})"), {"lr must be a double", "\"0.1\""});
  expect_value_error(apply(R"({"muon_num_ns_steps": 5.5})"), {"muon_num_ns_steps must be an int", "5.5"});
  expect_value_error(apply(R"({"muon_momentum": 1.5})"), {"muon_momentum", "1.5"});
  expect_value_error(apply(R"({"muon_qkv_split_sizes": [1, "a"]})"), {"muon_qkv_split_sizes", "[1,\"a\"]"});
  expect_value_error(apply(R"({"lr": )"), {"not valid JSON at lr"});
  expect_value_error(apply(R"([1, 2])"), {"must be a JSON object"});
  expect_value_error(apply(R"({"overrides": {}})"), {"overrides must be a list"});
  expect_value_error(apply(R"({"overrides": [{"match": {"nmae": "*"}, "set": {"lr": 1}}]})"),
                     {"unknown key 'nmae'", "overrides[0].match", "did you mean 'name'"});
  expect_value_error(apply(R"({"overrides": [{"match": {"ndim": "2"}, "set": {"lr": 1}}]})"),
                     {"overrides[0].match.ndim must be an int >= 0", "\"2\""});
  expect_value_error(apply(R"({"overrides": [{"match": {}, "set": {"lr": -1}}]})"), {"overrides[0].set.lr", "-1"});
  expect_value_error(apply(R"({"overrides": [{"match": {}, "sett": {"lr": 1}}]})"), {"unknown key 'sett'", "did you mean 'set'"});
  expect_value_error(apply(R"({"overrides": [{"match": {}}]})"), {"overrides[0] needs \"set\""});
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 3e-4);  // the first document set lr before failing
  EXPECT_TRUE(c.overrides().empty());
}

TEST(Config, JsonFile) {
  OptimizerConfig c;
  const auto path = temp_file("muon_config_test.json", R"({"optimizer": "lion", "lion_beta1": 0.95})");
  muon::load_config_file(c, path);
  EXPECT_EQ(c.get_string("optimizer"), "lion");
  EXPECT_DOUBLE_EQ(c.get_double("lion_beta1"), 0.95);
  const auto bad = temp_file("muon_config_bad.json", R"({"lion_beta": 0.95})");
  expect_value_error([&] { muon::load_config_file(c, bad); }, {bad, "unknown key 'lion_beta'", "lion_beta1"});
  expect_value_error([&] { muon::load_config_file(c, "/nonexistent/x.json"); }, {"cannot open", "/nonexistent/x.json"});
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

// ---- flags ----------------------------------------------------------------------

TEST(Config, Flags) {
  OptimizerConfig c;
  ASSERT_TRUE(muon::parse_config_flags(
      c, {"--optimizer", "adaptive_muon", "--lr", "0.01", "--muon-momentum", "0.8", "--muon_nesterov=false",
          "--muon_qkv_split_sizes", "4,2,2", "--lr_decay_style", "cosine",
          "--override", R"({"match": {"name": "*.bias"}, "set": {"weight_decay": 0}})"}));
  EXPECT_EQ(c.get_string("optimizer"), "adaptive_muon");
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 0.01);
  EXPECT_DOUBLE_EQ(c.get_double("muon_momentum"), 0.8);
  EXPECT_FALSE(c.get_bool("muon_nesterov"));
  EXPECT_EQ(c.get_int_list("muon_qkv_split_sizes"), (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(c.get_string("lr_decay_style"), "cosine");
  ASSERT_EQ(c.overrides().size(), 1u);
  EXPECT_EQ(*c.overrides()[0].match.name, "*.bias");

  // Bool flags: bare, "=value" and "value".
  ASSERT_TRUE(muon::parse_config_flags(c, {"--muon_nesterov", "--sgd-nesterov", "yes", "--muon_split_qkv", "false"}));
  EXPECT_TRUE(c.get_bool("muon_nesterov"));
  EXPECT_TRUE(c.get_bool("sgd_nesterov"));
  EXPECT_FALSE(c.get_bool("muon_split_qkv"));
  ASSERT_TRUE(muon::parse_config_flags(c, {"--muon_nesterov=off"}));
  EXPECT_FALSE(c.get_bool("muon_nesterov"));

  // argc/argv form, and a config file that flags override.
  const auto path = temp_file("muon_flags_test.json", R"({"lr": 0.5, "muon_momentum": 0.5})");
  OptimizerConfig d;
  const std::string config_arg = path;
  const char* argv[] = {"train", "--config", config_arg.c_str(), "--lr", "0.25"};
  ASSERT_TRUE(muon::parse_config_flags(d, 5, argv));
  EXPECT_DOUBLE_EQ(d.get_double("lr"), 0.25);
  EXPECT_DOUBLE_EQ(d.get_double("muon_momentum"), 0.5);
  std::remove(path.c_str());
}

TEST(Config, FlagErrorsNameFlagAndValueAndChangeNothing) {
  OptimizerConfig c;
  auto parse = [&](std::vector<std::string> args) { return [&c, args] { muon::parse_config_flags(c, args); }; };
  expect_value_error(parse({"--lr", "0.1", "--muon_momentun", "0.9"}),
                     {"unknown flag '--muon_momentun'", "did you mean '--muon_momentum'"});
  expect_value_error(parse({"--adam-bta2=0.9"}), {"unknown flag '--adam-bta2'", "did you mean '--adam_beta2'"});
  expect_value_error(parse({"--lr", "fast"}), {"lr must be a double", "'fast'"});
  expect_value_error(parse({"--lr", "-1"}), {"lr must be a double in [0, inf)", "-1"});
  expect_value_error(parse({"--muon_scale_mode", "rms"}), {"muon_scale_mode must be one of", "\"rms\""});
  expect_value_error(parse({"--override", "{not json"}), {"--override", "not valid JSON"});
  expect_value_error(parse({"stray"}), {"unexpected argument 'stray'"});
  expect_value_error(parse({"--muon_nesterov=maybe"}), {"muon_nesterov must be a bool", "'maybe'"});
  expect_value_error(parse({"--lr", "0.1", "--lr", "0.2"}), {"bad flags", "lr"});
  EXPECT_DOUBLE_EQ(c.get_double("lr"), 3e-4);
}

// ---- names and normalization ported from the field --------------------------------

// The Muon options `config` gives a 2-D parameter.
muon::MuonOptions muon_options_of(const OptimizerConfig& config) {
  torch::OrderedDict<std::string, at::Tensor> named;
  named.insert("block.weight", at::randn({8, 4}).requires_grad_());
  auto opt = muon::make_optimizer(named, config);
  EXPECT_EQ(opt->part_name(0), "muon");
  return static_cast<const muon::MuonOptions&>(opt->part(0).param_groups()[0].options());
}

TEST(Config, NsEpsModeKey) {
  OptimizerConfig c;
  EXPECT_EQ(c.get_string("muon_ns_eps_mode"), "add");
  EXPECT_EQ(muon_options_of(c).ns().eps_mode(), muon::NsEpsMode::kAdd);
  c.set("muon_ns_eps_mode", "clamp");
  EXPECT_EQ(muon_options_of(c).ns().eps_mode(), muon::NsEpsMode::kClamp);
  c.set_from_string("muon_ns_eps_mode", "add");
  EXPECT_EQ(muon_options_of(c).ns().eps_mode(), muon::NsEpsMode::kAdd);
  expect_value_error([&] { c.set("muon_ns_eps_mode", "max"); },
                     {"muon_ns_eps_mode must be one of", "add, clamp", "\"max\""});
}

TEST(Config, CoefficientNamesAndPalmDecayFromTheField) {
  OptimizerConfig c;
  c.set("muon_coefficient_type", "polar_express").set("muon_weight_decay_mode", "palm");
  auto o = muon_options_of(c);
  EXPECT_EQ(o.ns().coefficients().name, "polar_express");
  EXPECT_EQ(o.ns().steps(), 8);  // the paper's 8-step set, as in Megatron-Core
  EXPECT_EQ(o.weight_decay_mode(), muon::WeightDecayMode::kPalm);
  // The old name of the 8-step set is an alias: the same options.
  c.set("muon_coefficient_type", "polar_express_8");
  EXPECT_TRUE(muon_options_of(c).ns() == o.ns());
  c.set("muon_coefficient_type", "polar_express_5");
  EXPECT_DOUBLE_EQ(muon_options_of(c).ns().coefficients().safety_factor, 1.02);
  c.set("muon_coefficient_type", "cubic5");
  EXPECT_EQ(muon_options_of(c).ns().coefficients().name, "cubic5");
  expect_value_error([&] { c.set("muon_coefficient_type", "polar"); },
                     {"muon_coefficient_type must be one of", "polar_express_5", "cubic5",
                      "polar_express_8"});
}

TEST(Config, CustomCoefficientsFromTheirFields) {
  // muon_coefficient_type custom: one (a, b, c) every step (torch.optim.Muon's
  // ns_coefficients), from muon_ns_coefficient_a, _b, _c.
  OptimizerConfig c;
  EXPECT_DOUBLE_EQ(c.get_double("muon_ns_coefficient_a"), 3.4445);
  EXPECT_DOUBLE_EQ(c.get_double("muon_ns_coefficient_b"), -4.7750);
  EXPECT_DOUBLE_EQ(c.get_double("muon_ns_coefficient_c"), 2.0315);
  c.set("muon_coefficient_type", "custom")
      .set("muon_ns_coefficient_a", 3.0)
      .set("muon_ns_coefficient_b", -3.2)
      .set("muon_ns_coefficient_c", 1.2)
      .set("muon_num_ns_steps", int64_t{3});
  const auto o = muon_options_of(c);
  const auto& set = o.ns().coefficients();
  EXPECT_EQ(set.name, "custom");
  ASSERT_EQ(set.coefficients.size(), 1u);
  EXPECT_DOUBLE_EQ(set.coefficients[0].a, 3.0);
  EXPECT_DOUBLE_EQ(set.coefficients[0].b, -3.2);
  EXPECT_DOUBLE_EQ(set.coefficients[0].c, 1.2);
  EXPECT_EQ(set.schedule, muon::StepSchedule::kRepeatLast);
  EXPECT_EQ(o.ns().steps(), 3);
  // Another set name ignores the custom fields.
  c.set("muon_coefficient_type", "simple");
  EXPECT_DOUBLE_EQ(muon_options_of(c).ns().coefficients().coefficients[0].a, 3.4445);
}

TEST(Config, HelpListsEveryField) {
  OptimizerConfig c;
  const auto help = muon::config_help(c);
  for (const auto& f : c.fields()) EXPECT_NE(help.find("--" + f.name), std::string::npos) << f.name;
  EXPECT_NE(help.find("a double in [0, 1), default 0.95"), std::string::npos);
  testing::internal::CaptureStdout();
  EXPECT_FALSE(muon::parse_config_flags(c, {"--help"}));
  EXPECT_NE(testing::internal::GetCapturedStdout().find("--muon_momentum"), std::string::npos);
}

// ---- the global registry ------------------------------------------------------------
// Last: the test adds a field to every config made after it in this process.

TEST(GlobalRegistry, LayersAddTheirFieldsThemselves) {
  // The distributed layer of libmuon added its fields when the global
  // registry was created (src/distributed/layouts/make.cpp); the registry names no layer.
  std::vector<std::string> extensions;
  for (const auto& x : muon::OptimizerRegistry::global().extensions()) extensions.push_back(x->name);
  EXPECT_EQ(extensions, std::vector<std::string>{"muon::distributed"});
  EXPECT_TRUE(OptimizerConfig().has("layout"));
  EXPECT_TRUE(OptimizerConfig().has("muon_tp_mode"));

  // Given once the registry exists, a function runs at once.
  int runs = 0;
  muon::OptimizerRegistry::extend_global([&runs](muon::OptimizerRegistry& r) {
    ++runs;
    muon::ConfigExtension x;
    x.name = "test_layer";
    x.common_fields = {muon::FieldSpec::integer("test_layer_depth", 3, "a test layer's field").whole_run()};
    r.extend(std::move(x));
  });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(OptimizerConfig().get_int("test_layer_depth"), 3);
  expect_value_error([] { muon::OptimizerRegistry::extend_global(nullptr); }, {"extend_global needs a function"});
}

}  // namespace
