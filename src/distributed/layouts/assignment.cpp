// Owner assignment by longest-processing-time-first packing.
#include "muon/distributed/layouts/assignment.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace muon::distributed {

double newton_schulz_cost(int64_t rows, int64_t cols) {
  const auto s = static_cast<double>(std::min(rows, cols));
  const auto l = static_cast<double>(std::max(rows, cols));
  return l * s * s;
}

std::vector<int64_t> assign_owners(const std::vector<double>& costs, int64_t world) {
  TORCH_CHECK_VALUE(world >= 1, "[muon::distributed::assign_owners] world must be >= 1, got ", world);
  for (const auto i : c10::irange(costs.size())) {
    TORCH_CHECK_VALUE(std::isfinite(costs[i]) && costs[i] >= 0,
                      "[muon::distributed::assign_owners] costs[", i, "] must be finite and >= 0, got ",
                      costs[i]);
  }
  std::vector<size_t> order(costs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  std::vector<int64_t> owners(costs.size(), 0);
  for (const size_t item : order) {
    // min_element returns the first minimum: ties go to the lowest rank.
    const auto rank = std::min_element(load.begin(), load.end()) - load.begin();
    owners[item] = rank;
    load[static_cast<size_t>(rank)] += costs[item];
  }
  return owners;
}

std::vector<double> owner_loads(const std::vector<double>& costs,
                                const std::vector<int64_t>& owners, int64_t world) {
  TORCH_CHECK_VALUE(costs.size() == owners.size(), "[muon::distributed::owner_loads] ", costs.size(),
                    " costs but ", owners.size(), " owners");
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  for (const auto i : c10::irange(costs.size())) {
    TORCH_CHECK_VALUE(owners[i] >= 0 && owners[i] < world, "[muon::distributed::owner_loads] owners[",
                      i, "] = ", owners[i], " is not a rank of a world of ", world);
    load[static_cast<size_t>(owners[i])] += costs[i];
  }
  return load;
}

}  // namespace muon::distributed
