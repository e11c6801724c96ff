// Tests of muon/groups.h: the param groups a config makes (plan_groups), the
// fields a group carries and a group's settings; single-process, with the
// core's headers only.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "expect_util.h"
#include "muon/config.h"
#include "muon/groups.h"
#include "muon/registry.h"

namespace {

using muon::FieldSpec;
using muon::OptimizerConfig;
using muon::OptimizerRegistry;
using muon::test::expect_value_error;
using Named = torch::OrderedDict<std::string, at::Tensor>;

Named model() {
  Named named;
  named.insert("wte.weight", at::randn({40, 16}));
  named.insert("blocks.0.qkv.weight", at::randn({48, 16}));
  named.insert("blocks.0.norm.weight", at::randn({16}));
  named.insert("blocks.0.fc1.weight", at::randn({64, 16}));
  named.insert("blocks.0.fc1.bias", at::randn({64}));
  named.insert("lm_head.weight", at::randn({40, 16}));
  return named;
}

// The qkv matrix gets its own lr.
OptimizerConfig config() {
  OptimizerConfig c;
  c.set("optimizer", "muon").set("lr", 0.02).set("muon_momentum", 0.9);
  c.add_override(muon::OverrideRule().match_name("*.qkv.*").set("lr", 0.01));
  return c;
}

std::vector<std::string> names_of(const std::vector<FieldSpec>& fields) {
  std::vector<std::string> out;
  for (const auto& f : fields) out.push_back(f.name);
  return out;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(Groups, ThePlanIsTheGroupsMakeOptimizerBuilds) {
  const auto named = model();
  const auto plan = muon::plan_groups(named, config());
  ASSERT_EQ(plan.size(), 3u);  // muon (qkv at lr 0.01), muon, adamw
  EXPECT_EQ(plan[0].optimizer, "muon");
  EXPECT_EQ(plan[0].names, std::vector<std::string>{"blocks.0.qkv.weight"});
  EXPECT_EQ(std::get<double>(plan[0].settings.at("lr")), 0.01);
  EXPECT_EQ(plan[1].names, std::vector<std::string>{"blocks.0.fc1.weight"});
  EXPECT_EQ(std::get<double>(plan[1].settings.at("momentum")), 0.9);
  EXPECT_EQ(plan[2].optimizer, "adamw");  // 1-D, embedding and head
  EXPECT_EQ(plan[2].names.size(), 4u);

  auto opt = muon::make_optimizer(named, config());
  ASSERT_EQ(opt->param_groups().size(), plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto& group = opt->param_groups()[i];
    EXPECT_EQ(group.params().size(), plan[i].params.size()) << i;
    EXPECT_TRUE(group.params()[0].is_same(plan[i].params[0])) << i;
    EXPECT_EQ(group.options().get_lr(), std::get<double>(plan[i].settings.at("lr"))) << i;
  }
  expect_value_error([] { muon::plan_groups(Named(), config()); }, {"[muon::plan_groups]", "no parameters"});
}

TEST(Groups, FieldsOfAGroup) {
  const auto adamw = names_of(muon::group_fields("adamw"));
  ASSERT_GE(adamw.size(), 2u);
  EXPECT_EQ(adamw[0], "lr");  // the shared per-parameter fields first
  EXPECT_EQ(adamw[1], "weight_decay");
  EXPECT_TRUE(contains(adamw, "beta1"));  // adam's, which adamw reads
  EXPECT_FALSE(contains(adamw, "optimizer"));
  EXPECT_FALSE(contains(adamw, "lr_warmup_steps"));  // whole run
  EXPECT_TRUE(contains(names_of(muon::group_fields("muon")), "momentum"));
  expect_value_error([] { muon::group_fields("shampoo"); }, {"'shampoo'"});

  // A registry's own fields: the built-ins alone have no layout fields, the
  // global registry has those the distributed layer adds.
  OptimizerRegistry r;
  OptimizerRegistry::register_builtins(r);
  EXPECT_FALSE(contains(names_of(muon::group_fields("muon", r)), "tp_mode"));
  EXPECT_TRUE(contains(names_of(muon::group_fields("muon")), "tp_mode"));
}

TEST(Groups, SettingsOfAGroupTakeTheConfigsAndAreChecked) {
  const auto s = muon::group_settings("muon", {{"lr", 0.5}}, config());
  EXPECT_EQ(s.get_double("lr"), 0.5);
  EXPECT_EQ(s.get_double("momentum"), 0.9);  // the config's
  EXPECT_EQ(s.get_double("weight_decay"), config().get_double("weight_decay"));
  expect_value_error([] { muon::group_settings("muon", {{"momentun", 0.9}}, config()); },
                     {"unknown setting 'momentun'", "'muon'", "did you mean 'momentum'"});
  expect_value_error([] { muon::group_settings("muon", {{"momentum", 1.5}}, config()); },
                     {"momentum", "1.5"});
  expect_value_error([] { muon::group_settings("adamw", {{"lr_warmup_steps", int64_t{3}}}, config()); },
                     {"unknown setting 'lr_warmup_steps'"});
}

}  // namespace
