// A user optimizer from a plugin (tests/plugins/sign_descent.cpp, loaded with
// muon::load_plugin): its registry entry alone (options, factory, state
// schema) makes it configurable, buildable in every layout, counted in
// state bytes, explained, and checkpointed and resharded across world
// sizes and layouts, with no library file naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_model.h"
#include "distributed/checkpoints/checkpoint_state.h"
#include "muon/plugin.h"
#include "muon/registry.h"

namespace {

namespace fs = std::filesystem;
using namespace muon::test::checkpoint;  // NOLINT(google-build-using-namespace): the tests' model

void load_sign_descent() {
  static const auto added = muon::load_plugin(MUON_SIGN_DESCENT_PLUGIN);
  ASSERT_EQ(added, std::vector<std::string>{"sign_descent"});
}

TEST(Plugin, LoadingRegistersItsOptimizersOnceAndABadPathIsAnError) {
  load_sign_descent();
  EXPECT_TRUE(muon::OptimizerRegistry::global().has("sign_descent"));
  EXPECT_TRUE(muon::load_plugin(MUON_SIGN_DESCENT_PLUGIN).empty());  // already loaded: nothing new
  const auto keys = muon::OptimizerRegistry::global().keys();
  try {
    muon::load_plugin("/nonexistent/libnothing.so");
    FAIL() << "a missing library loaded";
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("/nonexistent/libnothing.so"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 600u) << msg;
  }
  EXPECT_EQ(muon::OptimizerRegistry::global().keys(), keys);
  // Its fields are config fields, checked like a built-in's.
  muon::OptimizerConfig c;
  c.set("optimizer", "sign_descent").set("sign_descent_beta", 0.8);
  EXPECT_THROW(c.set("sign_descent_beta", 1.5), c10::ValueError);
}

// A plugin's registrations are checked whole before any is added: one that
// registers a new name and then `muon` (tests/plugins/duplicate_name.cpp),
// or a copy of a loaded plugin at another path, is refused with one line
// naming the path and the name, and the registry is as before (it used to
// throw inside dlopen's initializers: std::terminate).
void expect_refused(const std::string& path, const std::string& name) {
  auto& registry = muon::OptimizerRegistry::global();
  const auto keys = registry.keys();
  const auto fields = registry.fields().size();
  try {
    muon::load_plugin(path);
    ADD_FAILURE() << path << " loaded";
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("[muon::load_plugin] '" + path + "' is refused and nothing it registers is added"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("optimizer '" + name + "' is already registered"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 800u) << msg;
  }
  EXPECT_EQ(registry.keys(), keys);
  EXPECT_EQ(registry.fields().size(), fields);
}

TEST(Plugin, APluginThatRegistersATakenNameIsRefusedWhole) {
  load_sign_descent();
  expect_refused(MUON_DUPLICATE_PLUGIN, "muon");
  EXPECT_FALSE(muon::OptimizerRegistry::global().has("plugin_first"));
  EXPECT_THROW(muon::OptimizerConfig().set("plugin_first_scale", 2.0), c10::ValueError);
  expect_refused(MUON_DUPLICATE_PLUGIN, "muon");  // again: still refused, not an empty success
  // A copy of the loaded sign_descent plugin at another path registers
  // sign_descent a second time.
  const auto dir = fs::temp_directory_path() / ("muon_plugin_copy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto copy = (dir / "libsign_descent_copy.so").string();
  fs::copy_file(MUON_SIGN_DESCENT_PLUGIN, copy, fs::copy_options::overwrite_existing);
  expect_refused(copy, "sign_descent");
  fs::remove_all(dir);
  // The registry still works: the first plugin's optimizer builds and the
  // same path loads as before (nothing new).
  EXPECT_TRUE(muon::load_plugin(MUON_SIGN_DESCENT_PLUGIN).empty());
  muon::OptimizerConfig c;
  c.set("optimizer", "sign_descent");
  auto p = at::ones({2, 2}).requires_grad_();
  torch::OrderedDict<std::string, at::Tensor> named;
  named.insert("w", p);
  EXPECT_NE(muon::make_optimizer(named, c), nullptr);
}

// Outside load_plugin, registration from a static initializer of the
// program itself (a linked-in optimizer) takes effect at once, and `add`
// still raises for a taken name.
muon::OptimizerEntry linked_in_entry(const std::string& name) {
  auto e = *muon::OptimizerRegistry::global().at("sgd");  // SGD under another name
  e.name = name;
  e.fields.clear();
  e.uses_fields_of = {"sgd"};
  e.state = muon::StateSchema();  // sgd's schema describes torch::optim::SGD's state
  return e;
}
const bool linked_in = [] {
  muon::OptimizerRegistry::global().add(linked_in_entry("linked_in_sgd"));
  return true;
}();

TEST(Plugin, StaticRegistrationOutsideLoadPluginTakesEffect) {
  EXPECT_TRUE(linked_in);
  EXPECT_TRUE(muon::OptimizerRegistry::global().has("linked_in_sgd"));
  auto p = at::ones({2, 2}).requires_grad_();
  torch::OrderedDict<std::string, at::Tensor> named;
  named.insert("w", p);
  EXPECT_NE(muon::make_optimizer(named, muon::OptimizerConfig().set("optimizer", "linked_in_sgd")),
            nullptr);
  EXPECT_THROW(muon::OptimizerRegistry::global().add(linked_in_entry("muon")), c10::ValueError);
  EXPECT_THROW(muon::OptimizerRegistry::global().add(linked_in_entry("linked_in_sgd")), c10::ValueError);
}

// The plain formula, in fp64, over `steps` steps of the model's seeded
// gradients: m ← β·m + (1 − β)·g; p ← p·(1 − lr·wd) − lr·sign(m).
at::Tensor sign_descent_reference(size_t k, int64_t steps) {
  auto p = full_param(k).to(at::kDouble);
  auto m = at::zeros_like(p);
  const double lr = 0.02, wd = 0.1, beta = 0.9;  // checkpoint_model.h's config, sign_descent's default β
  for (int64_t s = 0; s < steps; ++s) {
    m = beta * m + (1 - beta) * full_grad(k, s).to(at::kDouble);
    p = p * (1 - lr * wd) - lr * m.sign();
  }
  return p;
}

TEST(Plugin, StepsAsItsFormulaAndDescribesItsState) {
  load_sign_descent();
  muon::test::run_ranks(1, [&](Group& g) {
    Rank r("none", g, "sign_descent");
    r.train(0, 3);
    for (size_t k = 0; k < kModel.size(); ++k) {
      // fp32 against fp64: each step adds lr·sign(m) (exact in the sign,
      // unless m is within rounding of 0) and one rounding of p (2^-24
      // relative); 3 steps stay far below 1e-5 of max|p|. A wrong sign or
      // a missed decay moves an element by lr = 2e-2.
      const auto want = sign_descent_reference(k, 3);
      const auto diff = (r.named[kModel[k].first].detach().to(at::kDouble) - want).abs().max().item<double>();
      EXPECT_LE(diff, 1e-5 * want.abs().max().item<double>()) << kModel[k].first;
    }
    // State bytes come from the schema: one fp32 momentum per parameter.
    int64_t numel = 0;
    for (const auto& item : r.named) numel += item.value().numel();
    EXPECT_EQ(muon::optimizer_state_bytes(*r.opt), numel * 4);
    const auto slots = muon::distributed::detail::state_slots(*r.opt);
    ASSERT_EQ(slots.size(), kModel.size());
    EXPECT_EQ(slots[0].kind, "sign_descent");
  });
  Named whole;
  for (size_t k = 0; k < kModel.size(); ++k) whole.insert(kModel[k].first, full_param(k));
  const auto text = muon::explain(whole, config("none", "sign_descent"));
  EXPECT_NE(text.find("state of sign_descent: step [counter], momentum [param, zeros, rows]"),
            std::string::npos)
      << text;
}

fs::path fresh_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("muon_plugin_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

// A leg of SignDescent's reshard chain (reshard_leg); with `reference`, each
// rank's part must equal it bit for bit: SignDescent is elementwise, so every
// layout computes each element with the same operations on the same values.
void leg(const std::string& kind, int world, const std::string& in, const std::string& out, int64_t from,
         int64_t to, const Named& reference, const std::string& what) {
  reshard_leg(kind, world, in, out, from, to, "sign_descent", what, [&](Rank& r, const Group& group) {
    for (size_t k = 0; k < kModel.size() && !reference.is_empty(); ++k) {
      const auto& name = kModel[k].first;
      EXPECT_TRUE(at::equal(r.named[name].detach(), r.local[k](reference[name].detach())))
          << what << " " << name << " rank " << group.rank();
    }
  });
}

TEST(Plugin, CheckpointsReshardAcrossWorldSizesAndLayouts) {
  load_sign_descent();
  Named reference;
  muon::test::run_ranks(1, [&](Group& g) {
    Rank r("none", g, "sign_descent");
    r.train(0, 4);
    reference = r.named;
  });
  const auto dir = fresh_dir("reshard");
  const auto d = [&](const char* leg_name) { return (dir / leg_name).string(); };
  // Sharded at 2 → layer-wise at 3 → one process → sharded at 3: the
  // momentum is split by rows, gathered whole and split again.
  leg("sharded", 2, "", d("a"), 0, 1, Named(), "sharded W=2");
  leg("layerwise", 3, d("a"), d("b"), 1, 2, Named(), "layer-wise W=3 from sharded W=2");
  leg("none", 1, d("b"), d("c"), 2, 3, Named(), "single from layer-wise W=3");
  leg("sharded", 3, d("c"), d("e"), 3, 4, reference, "sharded W=3 from single");
  fs::remove_all(dir);
}

}  // namespace
