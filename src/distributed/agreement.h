// "Do all ranks agree": one collective check used wherever the ranks of a
// group must describe the same thing (parameters, shapes, which parameters
// step), so a mismatch raises the same error on every rank instead of
// hanging some of them in the next collective.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/distributed/group.h"

namespace muon::dist::detail {

/// FNV-1a of `text` continuing from `hash`: a signature of names and shapes
/// small enough to all-gather. Unsigned, so it wraps instead of overflowing.
inline uint64_t fnv1a(uint64_t hash, const std::string& text) {
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

/// The FNV-1a offset basis: the signature of nothing.
constexpr uint64_t kFnvOffset = 1469598103934665603ULL;

/// A signature as an int64 to all-gather (the low 63 bits).
inline int64_t signature_value(uint64_t hash) {
  return static_cast<int64_t>(hash & 0x7FFFFFFFFFFFFFFFULL);
}

/// Collective over `group`: every rank passes its `values`; unless all are
/// equal, every rank raises c10::ValueError "<who>on group '<name>' rank r
/// has [..], rank me has [..]: <what>", naming the first rank (in rank
/// order) whose values differ from its own.
inline void check_all_ranks_agree(const Group& group, const std::vector<int64_t>& values,
                                  const char* who, const std::string& what) {
  const auto all = group.all_gather_ints(values);
  const auto me = static_cast<size_t>(group.rank());
  for (const auto r : c10::irange(all.size())) {
    if (all[r] == all[me]) continue;
    TORCH_CHECK_VALUE(false, who, "on group '", group.name(), "' rank ", r, " has ",
                      c10::IntArrayRef(all[r]), ", rank ", me, " has ", c10::IntArrayRef(all[me]),
                      ": ", what);
  }
}

}  // namespace muon::dist::detail
