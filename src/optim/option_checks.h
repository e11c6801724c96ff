// The range checks the optimizers' options share, each with one message
// format: "<who><name> must be ..., got <value>". Internal.
#pragma once

#include <c10/util/Exception.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "muon/optim/listed_fields.h"
#include "util/names.h"

namespace muon::detail {

/// Raises c10::ValueError "<who><name> must be >= 0, got <value>" unless
/// `value` is finite and >= 0.
inline void check_non_negative(const char* who, const char* name, double value) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value >= 0, who, name, " must be >= 0, got ", value);
}

/// Raises c10::ValueError "<who><name> must be in [0, 1), got <value>"
/// unless 0 <= `value` < 1 (a decay or momentum).
inline void check_decay(const char* who, const char* name, double value) {
  TORCH_CHECK_VALUE(value >= 0 && value < 1, who, name, " must be in [0, 1), got ", value);
}

/// Raises c10::ValueError "<who><name> must be > 0, got <value>" unless
/// `value` is finite and > 0.
inline void check_positive(const char* who, const char* name, double value) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 0, who, name, " must be > 0, got ", value);
}

/// Raises c10::ValueError "<who><name> must be finite and > 0, got <value>"
/// (with " (<why>)" after "> 0" when `why` is given) unless `value` is
/// finite and > 0.
inline void check_finite_positive(const char* who, const char* name, double value, const char* why = nullptr) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 0, who, name, " must be finite and > 0",
                    why != nullptr ? std::string(" (") + why + ")" : std::string(), ", got ", value);
}

/// An Adam-style denominator's eps, which keeps 0/0 out of a zero gradient
/// element (check_finite_positive of "eps").
inline void check_denominator_eps(const char* who, double eps) {
  check_finite_positive(who, "eps", eps, "it keeps 0/0 out of a zero gradient element");
}

/// A field's name and value, for the checks of several fields at once.
struct NamedValue {
  const char* name;
  double value;
};

/// check_non_negative on each of `fields`, in order.
inline void check_non_negative(const char* who, std::initializer_list<NamedValue> fields) {
  for (const auto& f : fields) check_non_negative(who, f.name, f.value);
}

/// check_decay on each of `fields`, in order.
inline void check_decay(const char* who, std::initializer_list<NamedValue> fields) {
  for (const auto& f : fields) check_decay(who, f.name, f.value);
}

/// The strings `rule` allows ("a|b|c" split at '|'); empty when any.
inline std::vector<std::string> rule_choices(const FieldRule& rule) {
  std::vector<std::string> out;
  if (rule.choices == nullptr) return out;
  std::string rest = rule.choices;
  for (size_t bar = rest.find('|'); bar != std::string::npos; bar = rest.find('|')) {
    out.push_back(rest.substr(0, bar));
    rest.erase(0, bar + 1);
  }
  out.push_back(rest);
  return out;
}

/// Whether `value` is one of `rule`'s choices (any string when it has
/// none), read from "a|b|c" in place: validate() runs at every step.
inline bool rule_allows(const FieldRule& rule, const std::string& value) {
  if (rule.choices == nullptr) return true;
  for (const char* choice = rule.choices;; ++choice) {
    const char* bar = std::strchr(choice, '|');
    const size_t n = bar != nullptr ? static_cast<size_t>(bar - choice) : std::strlen(choice);
    if (value.size() == n && value.compare(0, n, choice, n) == 0) return true;
    if (bar == nullptr) return false;
    choice = bar;
  }
}

/// What `rule` asks of a number, as its message says it: "in [0, 1)",
/// ">= 0", "> 0", "<= 8" or "finite".
inline std::string rule_range(const FieldRule& rule) {
  const bool low = std::isfinite(rule.min);
  const bool high = std::isfinite(rule.max);
  if (low && high) {
    return c10::str("in ", rule.min_exclusive ? "(" : "[", rule.min, ", ", rule.max, rule.max_exclusive ? ")" : "]");
  }
  if (low) return c10::str(rule.min_exclusive ? "> " : ">= ", rule.min);
  if (high) return c10::str(rule.max_exclusive ? "< " : "<= ", rule.max);
  return "finite";
}

/// Raises c10::ValueError "<who><name> must be <range>[ (<why>)], got
/// <value>" unless the number `value` keeps `rule` (finite when bounded),
/// or "<who>unknown <name> '<value>'; valid names: ..." unless the string
/// `value` is one of its choices. Other types (bool, enums, dtypes) have
/// nothing to check.
template <class T>
void check_by_rule(const char* who, const char* name, const FieldRule& rule, const T& value) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int64_t>) {
    if (!rule.bounded() && !rule.finite) return;
    const auto v = static_cast<double>(value);
    const bool ok = std::isfinite(v) && (rule.min_exclusive ? v > rule.min : v >= rule.min) &&
                    (rule.max_exclusive ? v < rule.max : v <= rule.max);
    TORCH_CHECK_VALUE(ok, who, name, " must be ", rule_range(rule),
                      rule.why != nullptr ? std::string(" (") + rule.why + ")" : std::string(), ", got ", value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!rule_allows(rule, value)) check_name(value, rule_choices(rule), who, name);
  }
}

/// check_by_rule on each listed field of `o` (MUON_OPTIONS: kFields, kRules),
/// in the list's order: the checks of every field's own range.
template <class Options>
void check_listed_fields(const Options& o, const char* who) {
  size_t i = 0;
  std::apply(
      [&](const auto&... value) { ((check_by_rule(who, Options::kFields[i], Options::kRules[i], value), ++i), ...); },
      Options::fields(o));
}

}  // namespace muon::detail
