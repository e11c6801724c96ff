// Param groups laid out explicitly: the plan make_optimizer builds from a
// config, and the fields and settings of one group.
#include "muon/groups.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "registry_internal.h"

namespace muon {

std::vector<FieldSpec> group_fields(const std::string& optimizer, const OptimizerRegistry& registry) {
  std::vector<FieldSpec> out;
  for (const auto& f : registry.shared_fields()) {
    if (f.per_parameter && f.name != "optimizer") out.push_back(f);
  }
  const auto entry = registry.at(optimizer);
  auto add = [&](const std::string& name) {
    for (auto f : registry.option_fields(name)) {
      const auto same = [&](const FieldSpec& g) { return g.name == f.name; };
      const auto it = std::find_if(out.begin(), out.end(), same);
      if (it == out.end()) {
        out.push_back(std::move(f));
      } else {
        *it = std::move(f);  // the entry's own fields win over those it uses
      }
    }
  };
  for (const auto& other : entry->uses_fields_of) add(other);
  add(optimizer);
  return out;
}

OptimizerSettings group_settings(const std::string& optimizer,
                                 const std::map<std::string, FieldValue>& settings,
                                 const OptimizerConfig& config, const OptimizerRegistry& registry) {
  const auto entry = registry.at(optimizer);
  auto values = detail::settings_for(registry, *entry, config.values()).values();
  const auto fields = group_fields(optimizer, registry);
  for (const auto& [key, value] : settings) {
    const auto it = std::find_if(fields.begin(), fields.end(),
                                 [&](const FieldSpec& f) { return f.name == key; });
    if (it == fields.end()) {
      std::vector<std::string> known;
      for (const auto& f : fields) known.push_back(f.name);
      const auto near = nearest_name(key, known);
      TORCH_CHECK_VALUE(false, "unknown setting '", key.substr(0, kMaxSuggestedNameLength),
                        "' for optimizer '", optimizer, "'",
                        near.empty() ? std::string() : " (did you mean '" + near + "'?)");
    }
    values[key] = it->check(value);
  }
  return OptimizerSettings(std::move(values));
}

std::vector<GroupSpec> plan_groups(const torch::OrderedDict<std::string, at::Tensor>& named,
                                   const OptimizerConfig& config, const OptimizerRegistry& registry) {
  TORCH_CHECK_VALUE(!named.is_empty(), "[muon::plan_groups] no parameters given");
  auto resolved = detail::resolve_rules(named, config, registry);
  auto builds = detail::group_parameters(named, resolved, registry);
  std::vector<GroupSpec> out;
  for (const auto& name : registry.keys()) {  // the composite's group order
    for (auto& b : builds) {
      if (b.optimizer != name) continue;
      GroupSpec spec;
      spec.optimizer = b.optimizer;
      spec.names = b.names;
      spec.params = b.params;
      for (const auto& f : group_fields(name, registry)) spec.settings[f.name] = b.settings->get(f.name);
      out.push_back(std::move(spec));
    }
  }
  return out;
}

}  // namespace muon
