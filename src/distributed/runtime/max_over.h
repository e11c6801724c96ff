// The outcome of the checks before a step, agreed over a layout's groups
// (muon/optim/step_guard.h): the largest code and the rank that raised it.
#pragma once

#include <c10/util/irange.h>

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "muon/distributed/runtime/group.h"

namespace muon::distributed::detail {

/// Collective over every group of `groups`, in order: the largest `code`
/// any of their processes passed, and the lowest rank (in groups[0]) that
/// passed it ({code, 0} without groups). With several groups the exchange
/// runs twice, so a code seen by one group reaches the processes that share
/// only another group with it.
inline std::pair<int64_t, int64_t> max_over_groups(const std::vector<const Group*>& groups,
                                                   int64_t code) {
  if (groups.empty()) return {code, 0};
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::pair<int64_t, int64_t> best{code, code > 0 ? groups[0]->rank() : kNone};
  const int passes = groups.size() > 1 ? 2 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    for (const auto* g : groups) {
      if (g->size() == 1) continue;
      for (const auto& v : g->all_gather_ints({best.first, best.second})) {
        if (v[0] > best.first || (v[0] == best.first && v[1] < best.second)) best = {v[0], v[1]};
      }
    }
  }
  if (best.second == kNone) best.second = 0;
  return best;
}

}  // namespace muon::distributed::detail
