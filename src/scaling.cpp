// Scale factors of the orthogonalized update.
#include "muon/scaling.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "util/names.h"

namespace muon {
namespace {

constexpr detail::EnumName<ScaleMode> kScaleModes[] = {
    {ScaleMode::kShapeScaling, "shape_scaling"},
    {ScaleMode::kSpectral, "spectral"},
    {ScaleMode::kUnitRmsNorm, "unit_rms_norm"},
    {ScaleMode::kMatchRmsAdamW, "match_rms_adamw"}};

}  // namespace

std::vector<std::string> scale_mode_names() { return detail::names_of(kScaleModes); }

MUON_DEFINE_ENUM_NAMES(ScaleMode, parse_scale_mode, kScaleModes, "[muon::parse_scale_mode] ", "scale mode");

double scale_factor(int64_t rows, int64_t cols, ScaleMode mode, double extra_scale_factor) {
  TORCH_CHECK_VALUE(rows >= 1, "[muon::scale_factor] rows must be >= 1, got ", rows);
  TORCH_CHECK_VALUE(cols >= 1, "[muon::scale_factor] cols must be >= 1, got ", cols);
  TORCH_CHECK_VALUE(std::isfinite(extra_scale_factor) && extra_scale_factor > 0,
                    "[muon::scale_factor] extra_scale_factor must be finite and > 0, got ",
                    extra_scale_factor);
  const auto r = static_cast<double>(rows);
  const auto c = static_cast<double>(cols);
  double f = 1.0;
  switch (mode) {
    case ScaleMode::kShapeScaling:
      f = std::sqrt(std::max(1.0, r / c));
      break;
    case ScaleMode::kSpectral:
      f = std::sqrt(std::max(r, c));
      break;
    case ScaleMode::kUnitRmsNorm:
      f = std::sqrt(r / c);
      break;
    case ScaleMode::kMatchRmsAdamW:
      f = 0.2 * std::sqrt(std::max(r, c));
      break;
  }
  return f * extra_scale_factor;
}

std::pair<int64_t, int64_t> matrix_dims(c10::IntArrayRef shape) {
  TORCH_CHECK_VALUE(shape.size() >= 2, "[muon::matrix_dims] expected a shape with ndim >= 2, got ",
                    shape);
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return {shape[0], cols};
}

}  // namespace muon
