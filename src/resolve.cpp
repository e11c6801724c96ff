// Parameter resolution: the override rules applied to every parameter,
// param groups of equal settings, and explain().
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <iomanip>
#include <sstream>
#include <unordered_map>

#include "config_internal.h"
#include "muon/newton_schulz.h"
#include "muon/optim/routing.h"
#include "muon/registry.h"
#include "registry_internal.h"
#include "util/dtype_names.h"
#include "util/names.h"

namespace muon {

using detail::clip;
using detail::join;
using detail::kMakeWho;
using detail::reference_of;

namespace {

struct Props {
  int64_t ndim;
  std::vector<int64_t> shape;
  bool is_bias;
  bool is_embedding;
  bool is_head;
};

bool any_glob(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return glob_match(p, name); });
}

Props props_of(const std::string& name, const at::Tensor& p, const RoutingRules& routing) {
  const auto dot = name.rfind('.');
  const auto last = dot == std::string::npos ? name : name.substr(dot + 1);
  return {p.dim(), p.sizes().vec(), last.find("bias") != std::string::npos,
          any_glob(routing.embedding_patterns(), name), any_glob(routing.head_patterns(), name)};
}

bool matches(const ParamMatch& m, const re2::RE2* re, const std::string& name, const Props& p,
             const std::string& optimizer) {
  if (m.name && !glob_match(*m.name, name)) return false;
  if (re != nullptr && !detail::regex_full_match(*re, name)) return false;
  if (m.ndim && p.ndim != *m.ndim) return false;
  if (m.max_ndim && p.ndim > *m.max_ndim) return false;
  if (m.shape && p.shape != *m.shape) return false;
  if (m.is_bias && p.is_bias != *m.is_bias) return false;
  if (m.is_embedding && p.is_embedding != *m.is_embedding) return false;
  if (m.is_head && p.is_head != *m.is_head) return false;
  if (m.optimizer && optimizer != *m.optimizer) return false;
  return true;
}

}  // namespace

namespace detail {

std::vector<ResolvedParameter> resolve_rules(const torch::OrderedDict<std::string, at::Tensor>& named,
                                             const OptimizerConfig& config,
                                             const OptimizerRegistry& registry,
                                             bool allow_unmatched) {
  const auto& base = config.values();
  const auto main = registry.at(config.get_string("optimizer"));
  struct Rule {
    const OverrideRule* rule;
    std::shared_ptr<const re2::RE2> re;
    bool user;
    size_t hits = 0;
  };
  std::vector<Rule> rules;
  for (const auto& r : main->default_overrides) rules.push_back({&r, nullptr, false});
  for (const auto& r : config.overrides()) rules.push_back({&r, nullptr, true});
  for (auto& r : rules) {
    if (r.rule->match.regex) r.re = detail::compile_regex(*r.rule->match.regex, r.rule->label);
  }
  const RoutingRules routing;
  std::vector<ResolvedParameter> out;
  std::unordered_map<const c10::TensorImpl*, size_t> first;
  for (const auto& item : named) {
    ResolvedParameter r;
    r.name = item.key();
    r.shape = item.value().sizes().vec();
    const auto [it, fresh] = first.emplace(item.value().unsafeGetTensorImpl(), out.size());
    if (!fresh) {
      const auto& of = out[it->second];
      r.alias_of = of.name;
      r.optimizer = of.optimizer;
      r.values = of.values;
      out.push_back(std::move(r));
      continue;
    }
    r.values = base;
    const auto props = props_of(r.name, item.value(), routing);
    for (auto& rule : rules) {
      const auto& current = std::get<std::string>(r.values.at("optimizer"));
      if (!matches(rule.rule->match, rule.re.get(), r.name, props, current)) continue;
      ++rule.hits;
      r.rules.push_back(rule.rule->label);
      for (const auto& [key, value] : rule.rule->set_fields) {
        const auto ref = reference_of(value);
        r.values[key] = ref.empty() ? value : base.at(ref);
      }
    }
    r.optimizer = std::get<std::string>(r.values.at("optimizer"));
    TORCH_CHECK_VALUE(registry.has(r.optimizer), kMakeWho, "parameter '", clip(r.name),
                      "' resolves to optimizer '", clip(r.optimizer), "', which is not registered; registered: ",
                      join(registry.keys()));
    out.push_back(std::move(r));
  }
  for (const auto& rule : rules) {
    TORCH_CHECK_VALUE(!rule.user || rule.hits > 0 || allow_unmatched, kMakeWho, "override '", clip(rule.rule->label), "' (",
                      rule.rule->match.describe(), ") matches no parameter");
  }
  return out;
}

std::vector<ParamGroupPlan> group_parameters(const torch::OrderedDict<std::string, at::Tensor>& named,
                                    std::vector<ResolvedParameter>& resolved,
                                    const OptimizerRegistry& registry) {
  std::vector<ParamGroupPlan> builds;
  std::map<std::string, size_t> by_key;
  for (size_t i = 0; i < resolved.size(); ++i) {
    auto& r = resolved[i];
    if (!r.alias_of.empty()) continue;
    const auto entry = registry.at(r.optimizer);
    auto settings = settings_for(registry, *entry, r.values);
    std::string key = r.optimizer;
    for (const auto& [k, v] : settings.values()) key += "\n" + k + "=" + to_string(v);
    auto [it, fresh] = by_key.emplace(key, builds.size());
    if (fresh) {
      builds.push_back({r.optimizer, {}, {}, {}, std::make_unique<OptimizerSettings>(std::move(settings))});
    }
    auto& b = builds[it->second];
    b.params.push_back(named[i].value());
    b.names.push_back(r.name);
    b.members.push_back(i);
  }
  // Number the groups as the composite will: by optimizer in registry order.
  int64_t next = 0;
  for (const auto& name : registry.keys()) {
    for (auto& b : builds) {
      if (b.optimizer != name) continue;
      for (const auto m : b.members) resolved[m].group = next;
      ++next;
    }
  }
  return builds;
}

}  // namespace detail

std::vector<ResolvedParameter> resolve_parameters(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const OptimizerRegistry& registry) {
  auto resolved = detail::resolve_rules(named, config, registry);
  detail::group_parameters(named, resolved, registry);  // numbers the groups
  return resolved;
}

std::string explain(const torch::OrderedDict<std::string, at::Tensor>& named,
                    const OptimizerConfig& config, const OptimizerRegistry& registry) {
  auto resolved = detail::resolve_rules(named, config, registry);
  detail::group_parameters(named, resolved, registry);
  std::vector<std::array<std::string, 5>> rows;
  rows.push_back({"parameter", "shape", "optimizer", "group", "settings"});
  for (const auto& r : resolved) {
    std::string settings;
    if (!r.alias_of.empty()) {
      settings = "same tensor as '" + r.alias_of + "' (optimized once)";
    } else {
      const auto entry = registry.at(r.optimizer);
      const auto mine = detail::settings_for(registry, *entry, r.values);
      const auto base = detail::settings_for(registry, *entry, config.values());
      std::vector<std::string> parts;
      for (const auto& [k, v] : mine.values()) {
        const bool always = k == "lr" || k == "weight_decay";
        const auto spec_it = std::find_if(config.fields().begin(), config.fields().end(),
                                          [&](const FieldSpec& f) { return f.name == k; });
        const bool whole_run = spec_it != config.fields().end() && !spec_it->per_parameter;
        if (whole_run || k == "optimizer") continue;
        if (always || !(v == base.values().at(k))) parts.push_back(k + "=" + to_string(v));
      }
      settings = join(parts, " ");
      if (!r.rules.empty()) settings += "  [" + join(r.rules, "; ") + "]";
    }
    rows.push_back({r.name, to_string(FieldValue(r.shape)), r.optimizer,
                    r.group >= 0 ? std::to_string(r.group) : "-", settings});
  }
  // What each optimizer in use keeps per parameter (its state schema), then
  // what Newton–Schulz runs on.
  std::vector<std::string> footer;
  for (const auto& r : resolved) {
    if (!r.alias_of.empty()) continue;
    const auto& schema = registry.at(r.optimizer)->state;
    const auto line = "state of " + r.optimizer + ": " +
                      (schema.declared() ? schema.describe() : std::string("not described (no state schema)"));
    if (std::find(footer.begin(), footer.end(), line) == footer.end()) footer.push_back(line);
  }
  // What `auto` picks on this machine for each Newton–Schulz compute dtype
  // in use: the products' kernels (bf16 native or widened) and the method.
  for (const auto& r : resolved) {
    if (!r.alias_of.empty()) continue;
    const auto entry = registry.at(r.optimizer);
    const auto mine = detail::settings_for(registry, *entry, r.values);
    const auto it = mine.values().find("ns_compute_dtype");
    if (it == mine.values().end()) continue;
    const auto dtype_name = std::get<std::string>(it->second);
    const auto dtype = detail::parse_dtype(dtype_name, "", "muon_ns_compute_dtype");
    std::string line = "Newton–Schulz in " + dtype_name + ": " + newton_schulz_cpu_kernels(dtype);
    if (dtype == at::kBFloat16) {
      line += "; method auto: gram where long/short side >= 3, standard elsewhere";
    }
    if (std::find(footer.begin(), footer.end(), line) == footer.end()) footer.push_back(line);
  }
  std::array<size_t, 4> width{};
  for (const auto& row : rows) {
    for (size_t c = 0; c < 4; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  for (const auto& row : rows) {
    for (size_t c = 0; c < 4; ++c) out << std::left << std::setw(static_cast<int>(width[c] + 2)) << row[c];
    out << row[4] << "\n";
  }
  for (const auto& line : footer) out << line << "\n";
  return out.str();
}

}  // namespace muon
