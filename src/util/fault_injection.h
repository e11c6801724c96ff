// Fault points: places in a step where a test can make the library raise,
// to check that a step that fails changes nothing. Internal; disarmed, a
// point costs one relaxed atomic load.
#pragma once

#include <cstdint>

namespace muon::detail {

/// Test hook: the `n`-th fault point reached from now (0: the next one)
/// raises c10::Error "injected fault at <where>"; a negative `n` disarms.
/// Counts restart at 0.
void inject_fault_at(int64_t n);

/// Fault points reached since the last inject_fault_at.
int64_t fault_points_reached();

/// A fault point named `where` (e.g. "newton_schulz"): raises when armed and
/// its turn has come (see inject_fault_at), does nothing otherwise.
void fault_point(const char* where);

}  // namespace muon::detail
