#pragma once
// What the Newton–Schulz files (src/newton_schulz*.cpp) share: the 16-bit
// test, Gram Newton–Schulz's phases (which its FLOP count follows), and the
// two iterations on a normalized input (newton_schulz_iteration.cpp).
// Internal.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "muon/newton_schulz.h"
#include "newton_schulz_internal.h"

namespace muon::detail {

inline bool is_16bit_dtype(at::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf;
}

/// Gram Newton–Schulz phases: at most three steps each, balanced, with a
/// final phase of at most two (its rounding is what reaches the output).
/// Returns the 0-based steps that start a phase after the first.
std::vector<int64_t> gram_restarts(int64_t steps);

bool starts_phase(const std::vector<int64_t>& restarts, int64_t k);

/// The standard iteration on x0 (contiguous (b, m, n), compute dtype), on
/// the Gram matrix of the columns when `tall`. With `sums`, x is one block
/// of a matrix split over processes (see standard_newton_schulz).
at::Tensor standard_iteration(at::Tensor x, const std::vector<NsCoefficients>& schedule, bool tall,
                              bool symmetric, const PartialSums* sums);

/// Gram Newton–Schulz on x0 (contiguous (b, m, n), compute dtype), on the
/// Gram matrix of the columns when `tall`.
at::Tensor gram_iteration(at::Tensor x, const std::vector<NsCoefficients>& schedule, bool tall,
                          bool symmetric);

}  // namespace muon::detail
