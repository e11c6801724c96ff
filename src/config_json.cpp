// The optimizer config as JSON: reading documents and files into a config
// (all or nothing) and writing one back.
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "config_internal.h"
#include "muon/config.h"
#include "util/names.h"

namespace muon {

using detail::did_you_mean;
using detail::join;
using detail::kConfigWho;
using detail::reference_of;
using detail::rule_from_json;
using detail::value_from_json;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kMatchKeys = {"name",  "regex",    "ndim",         "max_ndim",
                                             "shape", "is_bias",  "is_embedding", "is_head",
                                             "optimizer"};
const std::vector<std::string> kRuleKeys = {"match", "set", "label"};

json to_json_value(const FieldValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

json match_to_json(const ParamMatch& m) {
  json j = json::object();
  if (m.name) j["name"] = *m.name;
  if (m.regex) j["regex"] = *m.regex;
  if (m.ndim) j["ndim"] = *m.ndim;
  if (m.max_ndim) j["max_ndim"] = *m.max_ndim;
  if (m.shape) j["shape"] = *m.shape;
  if (m.is_bias) j["is_bias"] = *m.is_bias;
  if (m.is_embedding) j["is_embedding"] = *m.is_embedding;
  if (m.is_head) j["is_head"] = *m.is_head;
  if (m.optimizer) j["optimizer"] = *m.optimizer;
  return j;
}

}  // namespace

namespace detail {

FieldValue value_from_json(const FieldSpec& field, const json& j, const std::string& where) {
  FieldSpec spec = field;
  spec.name = where;  // messages name the place in the document ("overrides[0].set.lr")
  auto fail = [&]() -> FieldValue {
    TORCH_CHECK_VALUE(false, kConfigWho, where, " must be ", spec.requirement(), ", got ", j.dump());
  };
  switch (spec.type) {
    case FieldType::kBool:
      if (!j.is_boolean()) return fail();
      return spec.check(j.get<bool>());
    case FieldType::kInt:
      if (!j.is_number_integer()) return fail();
      return spec.check(j.get<int64_t>());
    case FieldType::kDouble:
      if (!j.is_number()) return fail();
      return spec.check(j.get<double>());
    case FieldType::kString:
      if (!j.is_string()) return fail();
      return spec.check(j.get<std::string>());
    case FieldType::kStringList: {
      if (!j.is_array()) return fail();
      std::vector<std::string> out;
      for (const auto& e : j) {
        if (!e.is_string()) return fail();
        out.push_back(e.get<std::string>());
      }
      return spec.check(out);
    }
    case FieldType::kIntList: {
      if (!j.is_array()) return fail();
      std::vector<int64_t> out;
      for (const auto& e : j) {
        if (!e.is_number_integer()) return fail();
        out.push_back(e.get<int64_t>());
      }
      return spec.check(out);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

OverrideRule rule_from_json(const OptimizerConfig& config, const json& j, const std::string& where) {
  TORCH_CHECK_VALUE(j.is_object(), kConfigWho, where, " must be an object with \"match\" and \"set\", got ",
                    j.dump());
  OverrideRule rule;
  for (const auto& [key, value] : j.items()) {
    TORCH_CHECK_VALUE(std::find(kRuleKeys.begin(), kRuleKeys.end(), key) != kRuleKeys.end(), kConfigWho,
                      "unknown key '", key, "' in ", where, did_you_mean(key, kRuleKeys),
                      " (valid: ", join(kRuleKeys), ")");
  }
  if (j.contains("label")) {
    TORCH_CHECK_VALUE(j["label"].is_string(), kConfigWho, where, ".label must be a string, got ",
                      j["label"].dump());
    rule.label = j["label"].get<std::string>();
  }
  if (j.contains("match")) {
    const auto& m = j["match"];
    TORCH_CHECK_VALUE(m.is_object(), kConfigWho, where, ".match must be an object, got ", m.dump());
    for (const auto& [key, v] : m.items()) {
      const std::string at = where + ".match." + key;
      auto need = [&](bool ok, const char* what) {
        TORCH_CHECK_VALUE(ok, kConfigWho, at, " must be ", what, ", got ", v.dump());
      };
      if (key == "name") {
        need(v.is_string(), "a string (glob)");
        rule.match.name = v.get<std::string>();
      } else if (key == "regex") {
        need(v.is_string(), "a string (regex)");
        rule.match.regex = v.get<std::string>();
      } else if (key == "ndim" || key == "max_ndim") {
        need(v.is_number_integer() && v.get<int64_t>() >= 0, "an int >= 0");
        (key == "ndim" ? rule.match.ndim : rule.match.max_ndim) = v.get<int64_t>();
      } else if (key == "shape") {
        need(v.is_array() && std::all_of(v.begin(), v.end(),
                                         [](const json& e) { return e.is_number_integer(); }),
             "a list of ints");
        rule.match.shape = v.get<std::vector<int64_t>>();
      } else if (key == "is_bias" || key == "is_embedding" || key == "is_head") {
        need(v.is_boolean(), "a bool");
        (key == "is_bias" ? rule.match.is_bias
                          : key == "is_embedding" ? rule.match.is_embedding : rule.match.is_head) =
            v.get<bool>();
      } else if (key == "optimizer") {
        need(v.is_string(), "a string");
        rule.match.optimizer = v.get<std::string>();
      } else {
        TORCH_CHECK_VALUE(false, kConfigWho, "unknown key '", key, "' in ", where, ".match",
                          did_you_mean(key, kMatchKeys), " (valid: ", join(kMatchKeys), ")");
      }
    }
  }
  TORCH_CHECK_VALUE(j.contains("set") && j["set"].is_object(), kConfigWho, where,
                    " needs \"set\": an object of field → value");
  for (const auto& [key, v] : j["set"].items()) {
    const auto& spec = config.spec(key);  // unknown keys raise with a suggestion
    if (v.is_string() && !reference_of(FieldValue(v.get<std::string>())).empty()) {
      rule.set_fields[key] = v.get<std::string>();  // a "${field}" reference, checked by add_override
    } else {
      rule.set_fields[key] = value_from_json(spec, v, where + ".set." + key);
    }
  }
  return rule;
}

}  // namespace detail

namespace {

json rule_to_json(const OverrideRule& rule) {
  json j;
  j["match"] = match_to_json(rule.match);
  json set = json::object();
  for (const auto& [k, v] : rule.set_fields) set[k] = to_json_value(v);
  j["set"] = set;
  if (!rule.label.empty()) j["label"] = rule.label;
  return j;
}

void apply_json_object(OptimizerConfig& config, const json& doc) {
  TORCH_CHECK_VALUE(doc.is_object(), kConfigWho, "the config document must be a JSON object, got ",
                    doc.dump());
  std::vector<std::string> keys;
  for (const auto& f : config.fields()) keys.push_back(f.name);
  keys.push_back("overrides");
  for (const auto& [key, value] : doc.items()) {
    if (key == "overrides") continue;
    TORCH_CHECK_VALUE(config.has(key), kConfigWho, "unknown key '", key, "'", did_you_mean(key, keys));
    config.set(key, value_from_json(config.spec(key), value, key));
  }
  if (doc.contains("overrides")) {
    const auto& rules = doc["overrides"];
    TORCH_CHECK_VALUE(rules.is_array(), kConfigWho, "overrides must be a list of rules, got ", rules.dump());
    for (size_t i = 0; i < rules.size(); ++i) {
      config.add_override(rule_from_json(config, rules[i], "overrides[" + std::to_string(i) + "]"));
    }
  }
}

}  // namespace

std::string OptimizerConfig::to_json() const {
  json j = json::object();
  for (const auto& f : *fields_) j[f.name] = to_json_value(values_.at(f.name));
  json rules = json::array();
  for (const auto& r : overrides_) rules.push_back(rule_to_json(r));
  j["overrides"] = rules;
  return j.dump(2);
}

void apply_config_json(OptimizerConfig& config, const std::string& json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    TORCH_CHECK_VALUE(false, kConfigWho, "invalid JSON: ", e.what());
  }
  OptimizerConfig updated = config;  // all or nothing
  apply_json_object(updated, doc);
  config = std::move(updated);
}

void load_config_file(OptimizerConfig& config, const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), kConfigWho, "cannot open config file '", path, "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    apply_config_json(config, buffer.str());
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "in '", path, "': ", e.what_without_backtrace());
  }
}

}  // namespace muon
