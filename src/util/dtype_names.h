// Names of floating-point dtypes: one spelling set for the whole library.
// Parsing accepts torch's names ("float32", ...) and c10's ("Float", ...,
// what c10::toString prints and what older archives hold); printing gives
// torch's.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace muon::detail {

/// torch's name of a floating-point dtype: "float32" | "bfloat16" |
/// "float64" | "float16"; c10's name for any other dtype.
inline std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    default:
      return c10::toString(dtype);
  }
}

/// The canonical names of the floating-point dtypes, fp32 first.
inline std::vector<std::string> dtype_names() {
  return {"float32", "bfloat16", "float64", "float16"};
}

/// The dtype named `name` (torch's or c10's spelling); any other name raises
/// c10::ValueError "<who><what> must be a dtype name (...), got '<name>'".
inline at::ScalarType parse_dtype(const std::string& name, const char* who, const char* what) {
  for (const auto t : {at::kFloat, at::kBFloat16, at::kDouble, at::kHalf}) {
    if (name == dtype_name(t) || name == c10::toString(t)) return t;
  }
  TORCH_CHECK_VALUE(false, who, what,
                    " must be a dtype name (float32, bfloat16, float64, float16, or c10's Float, "
                    "BFloat16, Double, Half), got '",
                    name, "'");
}

}  // namespace muon::detail
