// The optimizer config: the field schema (FieldSpec), values, override
// rules and OptimizerConfig itself. JSON is in config_json.cpp, command-line
// flags in config_flags.cpp.
#include "muon/config.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include <re2/re2.h>

#include "config_internal.h"
#include "util/names.h"

namespace muon {

using detail::clip;
using detail::did_you_mean;
using detail::format_number;
using detail::kConfigWho;
using detail::reference_of;

namespace detail {

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

std::shared_ptr<const re2::RE2> compile_regex(const std::string& pattern, const std::string& rule) {
  TORCH_CHECK_VALUE(pattern.size() <= kMaxPatternLength, kConfigWho, "override '", clip(rule),
                    "' has a regex of ", pattern.size(), " bytes, longer than ", kMaxPatternLength, ": '",
                    clip(pattern), "'");
  RE2::Options options;
  options.set_log_errors(false);  // the error is raised, not logged
  auto re = std::make_shared<const re2::RE2>(pattern, options);
  TORCH_CHECK_VALUE(re->ok(), kConfigWho, "override '", clip(rule), "' has an invalid regex '", clip(pattern),
                    "': ", clip(re->error()), " (RE2 syntax: no backreferences or lookaround)");
  return re;
}

bool regex_full_match(const re2::RE2& re, const std::string& name) { return RE2::FullMatch(name, re); }

std::string reference_of(const FieldValue& value) {
  const auto* s = std::get_if<std::string>(&value);
  if (s == nullptr || s->size() < 4 || s->rfind("${", 0) != 0 || s->back() != '}') return {};
  return s->substr(2, s->size() - 3);
}

}  // namespace detail

// ---- values ------------------------------------------------------------------

std::string to_string(FieldType type) {
  // In FieldType's order, which is FieldValue's.
  static constexpr const char* kNames[] = {"bool", "int", "double", "string", "string list", "int list"};
  return kNames[static_cast<size_t>(type)];
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
    case FieldType::kStringList:
      return "[" +
             detail::join(std::get<std::vector<std::string>>(value),
                          [](const std::string& s) { return "\"" + s + "\""; }) +
             "]";
    case FieldType::kIntList:
      return "[" +
             detail::join(std::get<std::vector<int64_t>>(value),
                          [](int64_t x) { return std::to_string(x); }) +
             "]";
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  // A name this long is no typo of a field: its distance to every candidate
  // is its length, and computing it costs length × candidates.
  if (name.size() > kMaxSuggestedNameLength) return {};
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

namespace {
// A field of `type` with its default, doc and numeric bounds; what every
// FieldSpec factory starts from.
FieldSpec field_spec(std::string name, FieldType type, FieldValue def, std::string doc,
                     std::optional<double> min = std::nullopt,
                     std::optional<double> max = std::nullopt) {
  FieldSpec f;
  f.name = std::move(name);
  f.type = type;
  f.default_value = std::move(def);
  f.doc = std::move(doc);
  f.min = min;
  f.max = max;
  return f;
}
}  // namespace

FieldSpec FieldSpec::boolean(std::string name, bool def, std::string doc) {
  return field_spec(std::move(name), FieldType::kBool, def, std::move(doc));
}

FieldSpec FieldSpec::integer(std::string name, int64_t def, std::string doc,
                             std::optional<double> min, std::optional<double> max) {
  return field_spec(std::move(name), FieldType::kInt, def, std::move(doc), min, max);
}

FieldSpec FieldSpec::real(std::string name, double def, std::string doc, std::optional<double> min,
                          std::optional<double> max) {
  return field_spec(std::move(name), FieldType::kDouble, def, std::move(doc), min, max);
}

FieldSpec FieldSpec::text(std::string name, std::string def, std::string doc,
                          std::vector<std::string> choices) {
  FieldSpec f = field_spec(std::move(name), FieldType::kString, std::move(def), std::move(doc));
  f.choices = std::move(choices);
  return f;
}

FieldSpec FieldSpec::int_list(std::string name, std::vector<int64_t> def, std::string doc,
                              std::optional<double> min) {
  return field_spec(std::move(name), FieldType::kIntList, std::move(def), std::move(doc), min);
}

FieldSpec FieldSpec::string_list(std::string name, std::vector<std::string> def, std::string doc) {
  return field_spec(std::move(name), FieldType::kStringList, std::move(def), std::move(doc));
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
  if (!choices.empty()) r += ", one of " + detail::join(choices);
  return r;
}

FieldValue FieldSpec::check(const FieldValue& value) const {
  FieldValue v = value;
  if (type == FieldType::kDouble && type_of(v) == FieldType::kInt) {
    v = static_cast<double>(std::get<int64_t>(v));
  }
  TORCH_CHECK_VALUE(type_of(v) == type, kConfigWho, name, " must be ", requirement(), ", got ",
                    clip(to_string(value)), " (", to_string(type_of(value)), ")");
  auto in_range = [&](double x) {
    if (std::isnan(x)) return false;
    if (min && (min_exclusive ? !(x > *min) : !(x >= *min))) return false;
    if (max && (max_exclusive ? !(x < *max) : !(x <= *max))) return false;
    return true;
  };
  switch (type) {
    case FieldType::kInt:
      TORCH_CHECK_VALUE(in_range(static_cast<double>(std::get<int64_t>(v))), kConfigWho, name, " must be ",
                        requirement(), ", got ", to_string(v));  // an int: short
      break;
    case FieldType::kDouble:
      TORCH_CHECK_VALUE(std::isfinite(std::get<double>(v)) && in_range(std::get<double>(v)), kConfigWho,
                        name, " must be ", requirement(), ", got ", to_string(v));
      break;
    case FieldType::kIntList:
      for (const auto x : std::get<std::vector<int64_t>>(v)) {
        TORCH_CHECK_VALUE(in_range(static_cast<double>(x)), kConfigWho, name, " must be ", requirement(),
                          ", got ", clip(to_string(v)));
      }
      break;
    case FieldType::kString:
      TORCH_CHECK_VALUE(choices.empty() || std::find(choices.begin(), choices.end(),
                                                     std::get<std::string>(v)) != choices.end(),
                        kConfigWho, name, " must be one of ", detail::join(choices), ", got ", clip(to_string(v)),
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
  if (name) parts.push_back("name '" + clip(*name) + "'");
  if (regex) parts.push_back("regex '" + clip(*regex) + "'");
  if (ndim) parts.push_back("ndim " + std::to_string(*ndim));
  if (max_ndim) parts.push_back("ndim <= " + std::to_string(*max_ndim));
  if (shape) parts.push_back("shape " + to_string(FieldValue(*shape)));
  if (is_bias) parts.push_back(std::string(*is_bias ? "" : "not ") + "bias");
  if (is_embedding) parts.push_back(std::string(*is_embedding ? "" : "not ") + "embedding");
  if (is_head) parts.push_back(std::string(*is_head ? "" : "not ") + "output head");
  if (optimizer) parts.push_back("optimizer " + clip(*optimizer));
  return parts.empty() ? "every parameter" : detail::join(parts);
}

OverrideRule& OverrideRule::set(const std::string& key, FieldValue value) {
  set_fields[key] = std::move(value);
  return *this;
}

// ---- OptimizerConfig -----------------------------------------------------------

// The constructors over a registry are the registry's (src/registry.cpp):
// the config knows only the schema it is given.
OptimizerConfig::OptimizerConfig(std::vector<FieldSpec> schema)
    : fields_(std::make_shared<const std::vector<FieldSpec>>(std::move(schema))) {
  for (size_t i = 0; i < fields_->size(); ++i) {
    const auto& f = (*fields_)[i];
    TORCH_CHECK_VALUE(!f.name.empty(), kConfigWho, "schema field ", i, " has no name");
    TORCH_CHECK_VALUE(index_.emplace(f.name, i).second, kConfigWho, "schema has field '", clip(f.name),
                      "' twice");
    values_[f.name] = f.default_value;
  }
}

bool OptimizerConfig::has(const std::string& key) const { return index_.count(key) != 0; }

const FieldSpec& OptimizerConfig::spec(const std::string& key) const {
  const auto it = index_.find(key);
  if (it == index_.end()) {
    std::vector<std::string> names;
    for (const auto& f : *fields_) names.push_back(f.name);
    TORCH_CHECK_VALUE(false, kConfigWho, "unknown field '", clip(key), "'", did_you_mean(key, names));
  }
  return (*fields_)[it->second];
}

OptimizerConfig& OptimizerConfig::set(const std::string& key, FieldValue value) {
  values_[spec(key).name] = spec(key).check(value);
  return *this;
}

OptimizerConfig& OptimizerConfig::set_from_string(const std::string& key, const std::string& text) {
  return set(key, detail::value_from_text(spec(key), text));
}

const FieldValue& OptimizerConfig::get(const std::string& key) const {
  return values_.at(spec(key).name);
}

namespace {
template <typename T>
const T& typed(const OptimizerConfig& c, const std::string& key, FieldType want) {
  return detail::typed_value<T>(c.get(key), want, "[muon::OptimizerConfig] field ", key);
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
  TORCH_CHECK_VALUE(!rule.set_fields.empty(), kConfigWho, "override '", clip(rule.label),
                    "' sets no field");
  for (auto& [key, value] : rule.set_fields) {
    const auto& s = spec(key);
    TORCH_CHECK_VALUE(s.per_parameter, kConfigWho, "override '", clip(rule.label), "' sets ", key,
                      ", a whole-run setting that cannot differ per parameter");
    const auto ref = reference_of(value);
    if (!ref.empty()) {
      const auto& target = spec(ref);
      TORCH_CHECK_VALUE(target.type == s.type, kConfigWho, "override '", clip(rule.label), "' sets ", key,
                        " (", to_string(s.type), ") to ${", ref, "} (", to_string(target.type), ")");
    } else {
      value = s.check(value);
    }
  }
  if (rule.match.name) {
    // Matching a glob costs its length times the name's, for every parameter.
    TORCH_CHECK_VALUE(rule.match.name->size() <= detail::kMaxPatternLength, kConfigWho, "override '",
                      clip(rule.label), "' has a name glob of ", rule.match.name->size(),
                      " bytes, longer than ", detail::kMaxPatternLength, ": '", clip(*rule.match.name), "'");
  }
  if (rule.match.regex) detail::compile_regex(*rule.match.regex, rule.label);
  if (rule.match.optimizer) spec("optimizer").check(*rule.match.optimizer);
  overrides_.push_back(std::move(rule));
  return *this;
}

}  // namespace muon
