#pragma once
// Newton–Schulz entry for callers that normalize the input themselves.
// Internal.
#include <ATen/ATen.h>

#include "muon/newton_schulz.h"

namespace muon::detail {

/// The iterations of muon::newton_schulz on x0 = G / (‖G‖_F·safety + eps)
/// per matrix, already formed: x0 is a contiguous (b, m, n) tensor in the
/// compute dtype, and the options are valid. Returns the orthogonalized
/// (b, m, n) tensor in the compute dtype.
at::Tensor newton_schulz_normalized(at::Tensor x0, const NewtonSchulzOptions& options);

}  // namespace muon::detail
