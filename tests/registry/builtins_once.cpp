// Every built-in optimizer is registered exactly once, by explicit calls
// (src/builtin_entries.h) rather than static initializers a linker could drop
// from a static archive. Built twice (tests/CMakeLists.txt): against the
// shared libmuon and against a static archive of the core's objects.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <string>
#include <vector>

#include "muon/registry.h"

namespace {

const std::vector<std::string>& builtin_names() {
  static const std::vector<std::string> names{
      "muon",         "adaptive_muon", "adam",         "adamw",     "sgd",          "lion",
      "laprop",       "signum",        "sim_ademamix", "soap",      "kl_soap",      "kl_m_soap",
      "rekls",        "tp_rekls",      "rekls_v3",     "stacked_soap", "dion2",     "nordion2",
      "dion",         "iso",           "oblique_sgd",  "oblique_adam", "moso",      "psgd_pro",
      "polargrad",    "scion",         "mop",          "spel",      "muon_hyperball"};
  return names;
}

TEST(RegistryBuiltinsOnce, GlobalHoldsEveryBuiltinOnceInOrder) {
  const auto keys = muon::OptimizerRegistry::global().keys();
  EXPECT_EQ(keys, builtin_names());
  for (const auto& name : builtin_names()) {
    EXPECT_EQ(std::count(keys.begin(), keys.end(), name), 1) << name;
  }
}

TEST(RegistryBuiltinsOnce, RegisteringTwiceRaisesForDuplicates) {
  muon::OptimizerRegistry registry;
  muon::OptimizerRegistry::register_builtins(registry);
  EXPECT_EQ(registry.keys(), builtin_names());
  EXPECT_THROW(muon::OptimizerRegistry::register_builtins(registry), c10::ValueError);
  EXPECT_EQ(registry.keys(), builtin_names());
}

TEST(RegistryBuiltinsOnce, EveryBuiltinBuildsFromTheDefaults) {
  torch::nn::Linear layer(8, 4);
  for (const auto& name : builtin_names()) {
    SCOPED_TRACE(name);
    const auto config = muon::OptimizerConfig().set("optimizer", name);
    EXPECT_NO_THROW(muon::make_optimizer(layer->named_parameters(), config));
  }
}

}  // namespace
