// Owner assignment: LPT packing, determinism, balance, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "muon/distributed/layouts/assignment.h"

namespace {

using muon::distributed::assign_owners;
using muon::distributed::owner_loads;

TEST(Assignment, CostIsMaxTimesMinSquared) {
  EXPECT_DOUBLE_EQ(muon::distributed::newton_schulz_cost(512, 2048), 2048.0 * 512 * 512);
  EXPECT_DOUBLE_EQ(muon::distributed::newton_schulz_cost(2048, 512), 2048.0 * 512 * 512);
}

TEST(Assignment, LongestFirstToLeastLoaded) {
  // Sorted: 7 (item 1) → r0, 5 (item 3) → r1, 4 (item 0) → r1 (5 < 7),
  // 3 (item 2) → r0 (7 < 9), 2 (item 4) → r1 (9 < 10).
  const std::vector<double> costs{4, 7, 3, 5, 2};
  EXPECT_EQ(assign_owners(costs, 2), (std::vector<int64_t>{1, 0, 0, 1, 1}));
  EXPECT_EQ(owner_loads(costs, assign_owners(costs, 2), 2), (std::vector<double>{10, 11}));
  // Equal loads tie to the lowest rank.
  EXPECT_EQ(assign_owners({1, 1, 1}, 2), (std::vector<int64_t>{0, 1, 0}));
}

TEST(Assignment, WorldOneAndMoreRanksThanItems) {
  EXPECT_EQ(assign_owners({3, 1, 2}, 1), (std::vector<int64_t>{0, 0, 0}));
  // Fewer items than ranks: each item its own rank, the rest get nothing.
  EXPECT_EQ(assign_owners({1, 3}, 4), (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(assign_owners({}, 3).empty());
}

TEST(Assignment, BalancedOnTheReferenceModel) {
  // The 32-matrix, 25M-parameter set: per layer 1536×512, 512×512,
  // 2048×512, 512×2048, 8 layers. Every rank's load within 10% of total/W.
  std::vector<double> costs;
  for (int layer = 0; layer < 8; ++layer) {
    for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{
             {1536, 512}, {512, 512}, {2048, 512}, {512, 2048}}) {
      costs.push_back(muon::distributed::newton_schulz_cost(m, n));
    }
  }
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  for (const int64_t world : {2, 3, 4}) {
    const auto load = owner_loads(costs, assign_owners(costs, world), world);
    for (const double l : load) EXPECT_NEAR(l, total / world, 0.1 * total / world) << world;
  }
}

TEST(Assignment, Errors) {
  EXPECT_THROW(assign_owners({1}, 0), c10::ValueError);
  EXPECT_THROW(assign_owners({1, -1}, 2), c10::ValueError);
  EXPECT_THROW(owner_loads({1}, {2}, 2), c10::ValueError);
}

}  // namespace
