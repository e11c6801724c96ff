// The optimizer config: field schema, values, override rules, JSON and flags.
#include "muon/config.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <regex>
#include <sstream>

#include "muon/registry.h"

namespace muon {
namespace {

using json = nlohmann::json;

constexpr const char* kWho = "[muon::OptimizerConfig] ";

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string format_number(double x) {
  std::ostringstream s;
  s.precision(17);
  s << x;
  // Shortest form that round-trips keeps messages readable ("0.02", not "0.0200...").
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream t;
    t.precision(p);
    t << x;
    if (std::strtod(t.str().c_str(), nullptr) == x) return t.str();
  }
  return s.str();
}

std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates) {
  const auto best = nearest_name(name, candidates);
  return best.empty() ? std::string() : "; did you mean '" + best + "'?";
}

// ---- JSON <-> FieldValue -------------------------------------------------------

json to_json_value(const FieldValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

FieldValue from_json_value(const FieldSpec& field, const json& j, const std::string& where) {
  FieldSpec spec = field;
  spec.name = where;  // messages name the place in the document ("overrides[0].set.lr")
  auto fail = [&]() -> FieldValue {
    TORCH_CHECK_VALUE(false, kWho, where, " must be ", spec.requirement(), ", got ", j.dump());
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

// "${field}" → "field"; empty when `s` is not a reference.
std::string reference_of(const FieldValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  if (s == nullptr || s->size() < 4 || s->rfind("${", 0) != 0 || s->back() != '}') return {};
  return s->substr(2, s->size() - 3);
}

// Text → value of the field's type (flag values).
FieldValue parse_text(const FieldSpec& spec, const std::string& text) {
  auto fail = [&]() -> FieldValue {
    TORCH_CHECK_VALUE(false, kWho, spec.name, " must be ", spec.requirement(), ", got '", text,
                      "'");
  };
  auto parse_int = [&](const std::string& t, int64_t& out) {
    if (t.empty()) return false;
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(t.c_str(), &end, 10);
    if (errno != 0 || end != t.c_str() + t.size()) return false;
    out = static_cast<int64_t>(x);
    return true;
  };
  switch (spec.type) {
    case FieldType::kBool: {
      std::string t = text;
      std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
      if (t == "true" || t == "1" || t == "yes" || t == "on") return spec.check(true);
      if (t == "false" || t == "0" || t == "no" || t == "off") return spec.check(false);
      return fail();
    }
    case FieldType::kInt: {
      int64_t x = 0;
      if (!parse_int(text, x)) return fail();
      return spec.check(x);
    }
    case FieldType::kDouble: {
      if (text.empty()) return fail();
      errno = 0;
      char* end = nullptr;
      const double x = std::strtod(text.c_str(), &end);
      if (errno != 0 || end != text.c_str() + text.size()) return fail();
      return spec.check(x);
    }
    case FieldType::kString:
      return spec.check(text);
    case FieldType::kStringList:
    case FieldType::kIntList: {
      if (!text.empty() && text.front() == '[') {
        json j;
        try {
          j = json::parse(text);
        } catch (const json::exception&) {
          return fail();
        }
        return from_json_value(spec, j, spec.name);
      }
      std::vector<std::string> parts;
      if (!text.empty()) {
        std::stringstream ss(text);
        std::string item;
        while (std::getline(ss, item, ',')) parts.push_back(c10::str(item));
      }
      if (spec.type == FieldType::kStringList) return spec.check(parts);
      std::vector<int64_t> ints;
      for (const auto& p : parts) {
        int64_t x = 0;
        if (!parse_int(p, x)) return fail();
        ints.push_back(x);
      }
      return spec.check(ints);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

// ---- override rules <-> JSON ---------------------------------------------------

const std::vector<std::string> kMatchKeys = {"name",  "regex",    "ndim",         "max_ndim",
                                             "shape", "is_bias",  "is_embedding", "is_head",
                                             "optimizer"};
const std::vector<std::string> kRuleKeys = {"match", "set", "label"};

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

OverrideRule rule_from_json(const OptimizerConfig& config, const json& j, const std::string& where) {
  TORCH_CHECK_VALUE(j.is_object(), kWho, where, " must be an object with \"match\" and \"set\", got ",
                    j.dump());
  OverrideRule rule;
  for (const auto& [key, value] : j.items()) {
    TORCH_CHECK_VALUE(std::find(kRuleKeys.begin(), kRuleKeys.end(), key) != kRuleKeys.end(), kWho,
                      "unknown key '", key, "' in ", where, did_you_mean(key, kRuleKeys),
                      " (valid: ", join(kRuleKeys), ")");
  }
  if (j.contains("label")) {
    TORCH_CHECK_VALUE(j["label"].is_string(), kWho, where, ".label must be a string, got ",
                      j["label"].dump());
    rule.label = j["label"].get<std::string>();
  }
  if (j.contains("match")) {
    const auto& m = j["match"];
    TORCH_CHECK_VALUE(m.is_object(), kWho, where, ".match must be an object, got ", m.dump());
    for (const auto& [key, v] : m.items()) {
      const std::string at = where + ".match." + key;
      auto need = [&](bool ok, const char* what) {
        TORCH_CHECK_VALUE(ok, kWho, at, " must be ", what, ", got ", v.dump());
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
        TORCH_CHECK_VALUE(false, kWho, "unknown key '", key, "' in ", where, ".match",
                          did_you_mean(key, kMatchKeys), " (valid: ", join(kMatchKeys), ")");
      }
    }
  }
  TORCH_CHECK_VALUE(j.contains("set") && j["set"].is_object(), kWho, where,
                    " needs \"set\": an object of field → value");
  for (const auto& [key, v] : j["set"].items()) {
    const auto& spec = config.spec(key);  // unknown keys raise with a suggestion
    if (v.is_string() && !reference_of(FieldValue(v.get<std::string>())).empty()) {
      rule.set_fields[key] = v.get<std::string>();  // a "${field}" reference, checked by add_override
    } else {
      rule.set_fields[key] = from_json_value(spec, v, where + ".set." + key);
    }
  }
  return rule;
}

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
  TORCH_CHECK_VALUE(doc.is_object(), kWho, "the config document must be a JSON object, got ",
                    doc.dump());
  std::vector<std::string> keys;
  for (const auto& f : config.fields()) keys.push_back(f.name);
  keys.push_back("overrides");
  for (const auto& [key, value] : doc.items()) {
    if (key == "overrides") continue;
    TORCH_CHECK_VALUE(config.has(key), kWho, "unknown key '", key, "'", did_you_mean(key, keys));
    config.set(key, from_json_value(config.spec(key), value, key));
  }
  if (doc.contains("overrides")) {
    const auto& rules = doc["overrides"];
    TORCH_CHECK_VALUE(rules.is_array(), kWho, "overrides must be a list of rules, got ", rules.dump());
    for (size_t i = 0; i < rules.size(); ++i) {
      config.add_override(rule_from_json(config, rules[i], "overrides[" + std::to_string(i) + "]"));
    }
  }
}

}  // namespace

// ---- values ------------------------------------------------------------------

std::string to_string(FieldType type) {
  switch (type) {
    case FieldType::kBool:
      return "bool";
    case FieldType::kInt:
      return "int";
    case FieldType::kDouble:
      return "double";
    case FieldType::kString:
      return "string";
    case FieldType::kStringList:
      return "string list";
    case FieldType::kIntList:
      return "int list";
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

FieldType type_of(const FieldValue& value) { return static_cast<FieldType>(value.index()); }

std::string to_string(const FieldValue& value) {
  switch (type_of(value)) {
    case FieldType::kBool:
      return std::get<bool>(value) ? "true" : "false";
    case FieldType::kInt:
      return std::to_string(std::get<int64_t>(value));
    case FieldType::kDouble:
      return format_number(std::get<double>(value));
    case FieldType::kString:
      return "\"" + std::get<std::string>(value) + "\"";
    case FieldType::kStringList: {
      std::vector<std::string> q;
      for (const auto& s : std::get<std::vector<std::string>>(value)) q.push_back("\"" + s + "\"");
      return "[" + join(q) + "]";
    }
    case FieldType::kIntList: {
      std::vector<std::string> q;
      for (const auto x : std::get<std::vector<int64_t>>(value)) q.push_back(std::to_string(x));
      return "[" + join(q) + "]";
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  // Levenshtein distance; '-' and '_' are the same character (flag spellings).
  auto norm = [](char c) { return c == '-' ? '_' : static_cast<char>(std::tolower(c)); };
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    std::vector<size_t> prev(c.size() + 1);
    std::vector<size_t> cur(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= name.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        const size_t sub = prev[j - 1] + (norm(name[i - 1]) == norm(c[j - 1]) ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_d) {
      best_d = prev[c.size()];
      best = c;
    }
  }
  return best;
}

// ---- FieldSpec -----------------------------------------------------------------

FieldSpec FieldSpec::boolean(std::string name, bool def, std::string doc) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kBool;
  f.default_value = def;
  f.doc = std::move(doc);
  return f;
}

FieldSpec FieldSpec::integer(std::string name, int64_t def, std::string doc,
                             std::optional<double> min, std::optional<double> max) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kInt;
  f.default_value = def;
  f.doc = std::move(doc);
  f.min = min;
  f.max = max;
  return f;
}

FieldSpec FieldSpec::real(std::string name, double def, std::string doc, std::optional<double> min,
                          std::optional<double> max) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kDouble;
  f.default_value = def;
  f.doc = std::move(doc);
  f.min = min;
  f.max = max;
  return f;
}

FieldSpec FieldSpec::text(std::string name, std::string def, std::string doc,
                          std::vector<std::string> choices) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kString;
  f.default_value = std::move(def);
  f.doc = std::move(doc);
  f.choices = std::move(choices);
  return f;
}

FieldSpec FieldSpec::int_list(std::string name, std::vector<int64_t> def, std::string doc,
                              std::optional<double> min) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kIntList;
  f.default_value = std::move(def);
  f.doc = std::move(doc);
  f.min = min;
  return f;
}

FieldSpec FieldSpec::string_list(std::string name, std::vector<std::string> def, std::string doc) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = FieldType::kStringList;
  f.default_value = std::move(def);
  f.doc = std::move(doc);
  return f;
}

std::string FieldSpec::requirement() const {
  std::string r = (type == FieldType::kInt || type == FieldType::kIntList ? "an " : "a ") +
                  to_string(type);
  if (min || max) {
    auto bound = [](double x) { return std::isinf(x) ? std::string(x < 0 ? "-inf" : "inf") : format_number(x); };
    r += type == FieldType::kIntList ? " of values in " : " in ";
    r += (min && !min_exclusive) ? "[" : "(";
    r += min ? bound(*min) : "-inf";
    r += ", ";
    r += max ? bound(*max) : "inf";
    r += (max && !max_exclusive) ? "]" : ")";
  }
  if (!choices.empty()) r += ", one of " + join(choices);
  return r;
}

FieldValue FieldSpec::check(const FieldValue& value) const {
  FieldValue v = value;
  if (type == FieldType::kDouble && type_of(v) == FieldType::kInt) {
    v = static_cast<double>(std::get<int64_t>(v));
  }
  TORCH_CHECK_VALUE(type_of(v) == type, kWho, name, " must be ", requirement(), ", got ",
                    to_string(value), " (", to_string(type_of(value)), ")");
  auto in_range = [&](double x) {
    if (std::isnan(x)) return false;
    if (min && (min_exclusive ? !(x > *min) : !(x >= *min))) return false;
    if (max && (max_exclusive ? !(x < *max) : !(x <= *max))) return false;
    return true;
  };
  switch (type) {
    case FieldType::kInt:
      TORCH_CHECK_VALUE(in_range(static_cast<double>(std::get<int64_t>(v))), kWho, name, " must be ",
                        requirement(), ", got ", to_string(v));
      break;
    case FieldType::kDouble:
      TORCH_CHECK_VALUE(std::isfinite(std::get<double>(v)) && in_range(std::get<double>(v)), kWho,
                        name, " must be ", requirement(), ", got ", to_string(v));
      break;
    case FieldType::kIntList:
      for (const auto x : std::get<std::vector<int64_t>>(v)) {
        TORCH_CHECK_VALUE(in_range(static_cast<double>(x)), kWho, name, " must be ", requirement(),
                          ", got ", to_string(v));
      }
      break;
    case FieldType::kString:
      TORCH_CHECK_VALUE(choices.empty() || std::find(choices.begin(), choices.end(),
                                                     std::get<std::string>(v)) != choices.end(),
                        kWho, name, " must be one of ", join(choices), ", got ", to_string(v),
                        did_you_mean(std::get<std::string>(v), choices));
      break;
    default:
      break;
  }
  return v;
}

// ---- ParamMatch / OverrideRule -------------------------------------------------

std::string ParamMatch::describe() const {
  std::vector<std::string> parts;
  if (name) parts.push_back("name '" + *name + "'");
  if (regex) parts.push_back("regex '" + *regex + "'");
  if (ndim) parts.push_back("ndim " + std::to_string(*ndim));
  if (max_ndim) parts.push_back("ndim <= " + std::to_string(*max_ndim));
  if (shape) parts.push_back("shape " + to_string(FieldValue(*shape)));
  if (is_bias) parts.push_back(std::string(*is_bias ? "" : "not ") + "bias");
  if (is_embedding) parts.push_back(std::string(*is_embedding ? "" : "not ") + "embedding");
  if (is_head) parts.push_back(std::string(*is_head ? "" : "not ") + "output head");
  if (optimizer) parts.push_back("optimizer " + *optimizer);
  return parts.empty() ? "every parameter" : join(parts);
}

OverrideRule& OverrideRule::set(const std::string& key, FieldValue value) {
  set_fields[key] = std::move(value);
  return *this;
}

// ---- OptimizerConfig -----------------------------------------------------------

OptimizerConfig::OptimizerConfig() : OptimizerConfig(OptimizerRegistry::global()) {}

OptimizerConfig::OptimizerConfig(const OptimizerRegistry& registry)
    : fields_(std::make_shared<const std::vector<FieldSpec>>(registry.fields())) {
  for (size_t i = 0; i < fields_->size(); ++i) {
    const auto& f = (*fields_)[i];
    index_[f.name] = i;
    values_[f.name] = f.default_value;
  }
}

bool OptimizerConfig::has(const std::string& key) const { return index_.count(key) != 0; }

const FieldSpec& OptimizerConfig::spec(const std::string& key) const {
  const auto it = index_.find(key);
  if (it == index_.end()) {
    std::vector<std::string> names;
    for (const auto& f : *fields_) names.push_back(f.name);
    TORCH_CHECK_VALUE(false, kWho, "unknown field '", key, "'", did_you_mean(key, names));
  }
  return (*fields_)[it->second];
}

OptimizerConfig& OptimizerConfig::set(const std::string& key, FieldValue value) {
  values_[spec(key).name] = spec(key).check(value);
  return *this;
}

OptimizerConfig& OptimizerConfig::set_from_string(const std::string& key, const std::string& text) {
  return set(key, parse_text(spec(key), text));
}

const FieldValue& OptimizerConfig::get(const std::string& key) const {
  return values_.at(spec(key).name);
}

namespace {
template <typename T>
const T& typed(const OptimizerConfig& c, const std::string& key, FieldType want) {
  const auto& v = c.get(key);
  TORCH_CHECK_VALUE(type_of(v) == want, kWho, "field ", key, " is a ", to_string(type_of(v)),
                    ", not a ", to_string(want));
  return std::get<T>(v);
}
}  // namespace

bool OptimizerConfig::get_bool(const std::string& key) const {
  return typed<bool>(*this, key, FieldType::kBool);
}
int64_t OptimizerConfig::get_int(const std::string& key) const {
  return typed<int64_t>(*this, key, FieldType::kInt);
}
double OptimizerConfig::get_double(const std::string& key) const {
  return typed<double>(*this, key, FieldType::kDouble);
}
const std::string& OptimizerConfig::get_string(const std::string& key) const {
  return typed<std::string>(*this, key, FieldType::kString);
}
const std::vector<std::string>& OptimizerConfig::get_string_list(const std::string& key) const {
  return typed<std::vector<std::string>>(*this, key, FieldType::kStringList);
}
const std::vector<int64_t>& OptimizerConfig::get_int_list(const std::string& key) const {
  return typed<std::vector<int64_t>>(*this, key, FieldType::kIntList);
}

OptimizerConfig& OptimizerConfig::add_override(OverrideRule rule) {
  if (rule.label.empty()) rule.label = "rule " + std::to_string(overrides_.size() + 1);
  TORCH_CHECK_VALUE(!rule.set_fields.empty(), kWho, "override '", rule.label,
                    "' sets no field");
  for (auto& [key, value] : rule.set_fields) {
    const auto& s = spec(key);
    TORCH_CHECK_VALUE(s.per_parameter, kWho, "override '", rule.label, "' sets ", key,
                      ", a whole-run setting that cannot differ per parameter");
    const auto ref = reference_of(value);
    if (!ref.empty()) {
      const auto& target = spec(ref);
      TORCH_CHECK_VALUE(target.type == s.type, kWho, "override '", rule.label, "' sets ", key,
                        " (", to_string(s.type), ") to ${", ref, "} (", to_string(target.type), ")");
    } else {
      value = s.check(value);
    }
  }
  if (rule.match.regex) {
    try {
      std::regex re(*rule.match.regex);
    } catch (const std::regex_error& e) {
      TORCH_CHECK_VALUE(false, kWho, "override '", rule.label, "' has an invalid regex '",
                        *rule.match.regex, "': ", e.what());
    }
  }
  if (rule.match.optimizer) spec("optimizer").check(*rule.match.optimizer);
  overrides_.push_back(std::move(rule));
  return *this;
}

std::string OptimizerConfig::to_json() const {
  json j = json::object();
  for (const auto& f : *fields_) j[f.name] = to_json_value(values_.at(f.name));
  json rules = json::array();
  for (const auto& r : overrides_) rules.push_back(rule_to_json(r));
  j["overrides"] = rules;
  return j.dump(2);
}

// ---- JSON and flags ------------------------------------------------------------

void apply_config_json(OptimizerConfig& config, const std::string& json_text) {
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    TORCH_CHECK_VALUE(false, kWho, "invalid JSON: ", e.what());
  }
  OptimizerConfig updated = config;  // all or nothing
  apply_json_object(updated, doc);
  config = std::move(updated);
}

void load_config_file(OptimizerConfig& config, const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), kWho, "cannot open config file '", path, "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    apply_config_json(config, buffer.str());
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "in '", path, "': ", e.what_without_backtrace());
  }
}

std::string config_help(const OptimizerConfig& config) {
  std::ostringstream out;
  out << "Optimizer flags (also JSON keys; '-' may replace '_'):\n";
  out << "  --config FILE          JSON config applied before the flags\n";
  out << "  --override JSON        append an override rule {\"match\": {...}, \"set\": {...}}\n";
  for (const auto& f : config.fields()) {
    out << "  --" << f.name << "  " << f.requirement() << ", default "
        << to_string(f.default_value) << (f.per_parameter ? "" : " (whole run)") << "\n      "
        << f.doc << "\n";
  }
  return out.str();
}

bool parse_config_flags(OptimizerConfig& config, const std::vector<std::string>& args) {
  CLI::App app{"optimizer config"};
  app.allow_extras();
  app.set_help_flag();
  bool help = false;
  app.add_flag("-h,--help", help, "print the flags");
  std::string config_file;
  app.add_option("--config", config_file, "JSON config file");
  std::vector<std::string> rules;
  app.add_option("--override", rules, "override rule as JSON")->allow_extra_args(false);
  std::vector<std::pair<std::string, std::string>> given;  // field → text
  std::vector<std::string> storage(config.fields().size());
  std::vector<CLI::Option*> options;
  std::vector<std::string> flag_names;
  std::vector<std::string> bool_flags;
  for (size_t i = 0; i < config.fields().size(); ++i) {
    const auto& field = config.fields()[i];
    std::string names = "--" + field.name;
    flag_names.push_back("--" + field.name);
    std::string dashed = field.name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (dashed != field.name) names += ",--" + dashed;
    if (field.type == FieldType::kBool) {
      // A bare bool flag means true; --flag=false and --flag false set it.
      options.push_back(app.add_flag(names + "{true}", storage[i], field.doc));
      bool_flags.push_back("--" + field.name);
      bool_flags.push_back("--" + dashed);
    } else {
      options.push_back(app.add_option(names, storage[i], field.doc));
    }
  }
  // "--flag false" → "--flag=false" for bool flags (CLI11 flags take values only after '=').
  std::vector<std::string> joined;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool is_bool_flag =
        std::find(bool_flags.begin(), bool_flags.end(), args[i]) != bool_flags.end();
    if (is_bool_flag && i + 1 < args.size()) {
      std::string next = args[i + 1];
      std::transform(next.begin(), next.end(), next.begin(), [](unsigned char c) { return std::tolower(c); });
      if (next == "true" || next == "false" || next == "1" || next == "0" || next == "yes" ||
          next == "no" || next == "on" || next == "off") {
        joined.push_back(args[i] + "=" + args[i + 1]);
        ++i;
        continue;
      }
    }
    joined.push_back(args[i]);
  }
  std::vector<const char*> argv{"muon"};
  for (const auto& a : joined) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    TORCH_CHECK_VALUE(false, kWho, "bad flags: ", e.what());
  }
  if (help) {
    std::cout << config_help(config);
    return false;
  }
  const auto extras = app.remaining();
  for (const auto& extra : extras) {
    if (extra.rfind("--", 0) == 0) {
      const auto flag = extra.substr(0, extra.find('='));
      TORCH_CHECK_VALUE(false, kWho, "unknown flag '", flag, "'", did_you_mean(flag, flag_names));
    }
    TORCH_CHECK_VALUE(false, kWho, "unexpected argument '", extra, "'");
  }
  OptimizerConfig updated = config;  // all or nothing
  if (!config_file.empty()) load_config_file(updated, config_file);
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i]->count() > 0) updated.set_from_string(config.fields()[i].name, storage[i]);
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    json j;
    try {
      j = json::parse(rules[i]);
    } catch (const json::parse_error& e) {
      TORCH_CHECK_VALUE(false, kWho, "--override ", rules[i], " is not valid JSON: ", e.what());
    }
    updated.add_override(rule_from_json(updated, j, "--override " + std::to_string(i + 1)));
  }
  config = std::move(updated);
  return true;
}

bool parse_config_flags(OptimizerConfig& config, int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_config_flags(config, args);
}

}  // namespace muon
