#pragma once

/// Which rank owns which piece of work in the owner-compute layouts
/// (layer-wise and sharded Muon): each parameter (or matrix) is updated on
/// exactly one rank, and ranks get about equal Newton–Schulz cost.
#include <cstdint>
#include <vector>

#include "muon/distributed/namespace.h"

namespace muon::distributed {

/// Relative Newton–Schulz cost of an m×n matrix: max(m, n)·min(m, n)², the
/// leading term of every iteration (Megatron-Core's
/// LayerWiseDistributedOptimizer packs by the same measure).
double newton_schulz_cost(int64_t rows, int64_t cols);

/// Longest-processing-time-first packing (Graham 1969): items in decreasing
/// cost (ties by index) go one by one to the rank with the least total cost so
/// far (ties to the lowest rank). Returns the owner of each item, in [0,
/// world). Deterministic: every rank computes the same assignment from the
/// same costs. The largest rank load is at most 4/3 of the optimum.
/// Raises c10::ValueError for world < 1 or a negative or non-finite cost.
std::vector<int64_t> assign_owners(const std::vector<double>& costs, int64_t world);

/// The total cost per rank of an assignment.
std::vector<double> owner_loads(const std::vector<double>& costs,
                                const std::vector<int64_t>& owners, int64_t world);

}  // namespace muon::distributed
