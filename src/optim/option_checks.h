// The range checks the optimizers' options share, each with one message
// format: "<who><name> must be ..., got <value>". Internal.
#pragma once

#include <c10/util/Exception.h>

#include <cmath>
#include <initializer_list>
#include <string>

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

}  // namespace muon::detail
