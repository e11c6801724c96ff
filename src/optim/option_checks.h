// The range checks the optimizers' options share, each with one message
// format: "<who><name> must be ..., got <value>". Internal.
#pragma once

#include <c10/util/Exception.h>

#include <cmath>

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

}  // namespace muon::detail
