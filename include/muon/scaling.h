#pragma once

/// Scale factors applied to the orthogonalized update, computed from the
/// whole logical matrix shape (rows = size_out = dim 0, cols = size_in =
/// product of the remaining dims for conv weights), never from a shard.
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/enum_names.h"

namespace muon {

enum class ScaleMode {
  /// sqrt(max(1, rows/cols)) — Keller Jordan's Muon, torch.optim.Muon "original".
  kShapeScaling,
  /// sqrt(max(rows, cols)) — Megatron-Core / TransformerEngine default.
  kSpectral,
  /// sqrt(rows/cols) — unit RMS→RMS operator norm.
  kUnitRmsNorm,
  /// 0.2·sqrt(max(rows, cols)) — Moonlight's match of AdamW's update RMS.
  kMatchRmsAdamW,
};

/// "shape_scaling" | "spectral" | "unit_rms_norm" | "match_rms_adamw".
MUON_ENUM_NAMES(ScaleMode, parse_scale_mode);
std::vector<std::string> scale_mode_names();

/// The factor for a rows×cols logical matrix, times `extra_scale_factor`
/// (finite and > 0; anything else raises c10::ValueError naming it).
/// rows or cols < 1 raise c10::ValueError naming the size.
double scale_factor(int64_t rows, int64_t cols, ScaleMode mode, double extra_scale_factor = 1.0);

/// (rows, cols) of the 2-D view Muon uses for a parameter of `shape`:
/// (shape[0], prod(shape[1:])) for ndim >= 2. ndim < 2 raises c10::ValueError.
std::pair<int64_t, int64_t> matrix_dims(c10::IntArrayRef shape);

}  // namespace muon
