// Internals of muon::Muon that tests observe.
#pragma once

#include <cstdint>

namespace muon::detail {

/// How many times, in this process, muon::Muon::step ran its fused
/// parameters side by side on several threads (one matrix per thread).
int64_t side_by_side_steps();

}  // namespace muon::detail
