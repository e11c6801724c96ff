// Internals of muon::Muon that tests observe.
#pragma once

#include <cstdint>

namespace muon::detail {

/// How many times, in this process, muon::Muon::step ran its fused
/// parameters side by side on several threads (one matrix per thread).
int64_t side_by_side_steps();

/// How many batches (parameters of one shape and one set of Newton–Schulz
/// options orthogonalized in one call) muon::Muon's fused passes have run in
/// this process.
int64_t fused_batches_run();

}  // namespace muon::detail
