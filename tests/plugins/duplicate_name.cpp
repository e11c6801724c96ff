// A plugin that cannot be loaded whole (muon/plugin.h): it registers a new
// optimizer, `plugin_first`, then one named `muon`, which is already
// registered. muon::load_plugin refuses it with one line naming the path and
// `muon`, and adds neither (tests/test_plugin.cpp, tests/python/test_plugin.py,
// test_train_gpt's --plugin).
#include <muon/registry.h>
#include <torch/optim/sgd.h>

namespace {

muon::OptimizerEntry sgd_entry(const std::string& name) {
  muon::OptimizerEntry e;
  e.name = name;
  e.doc = "plain SGD under another name (tests/plugins/duplicate_name.cpp)";
  e.fields = {muon::FieldSpec::real("scale", 1.0, "unused", 0.0)};
  e.make_options = [](const muon::OptimizerSettings& s) {
    return std::make_unique<torch::optim::SGDOptions>(s.get_double("lr"));
  };
  e.factory = [](std::vector<torch::optim::OptimizerParamGroup> groups,
                 const std::vector<muon::OptimizerSettings>& settings) {
    return std::make_unique<torch::optim::SGD>(
        std::move(groups), torch::optim::SGDOptions(settings.at(0).get_double("lr")));
  };
  return e;
}

const bool registered = [] {
  muon::OptimizerRegistry::global().add(sgd_entry("plugin_first"));
  muon::OptimizerRegistry::global().add(sgd_entry("muon"));
  return true;
}();

}  // namespace
