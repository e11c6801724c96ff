// muon::distributed::Group: collectives, byte counts, sub-groups, timeouts and
// init_from_env, with ranks as threads over real Gloo process groups.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "dist_util.h"
#include "env_util.h"
#include "muon/distributed/runtime/group.h"

namespace {

using muon::distributed::Group;
using muon::distributed::GroupOptions;
using muon::test::run_ranks;
using muon::test::run_ranks_collect;

class DistGroupWorld : public ::testing::TestWithParam<int> {};

TEST(DistGroup, SingleRankDoesNoCommunication) {
  auto g = Group::single();
  EXPECT_EQ(g.rank(), 0);
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.backend_name(), "none");
  auto t = at::arange(6, at::kFloat);
  g.all_reduce_(t);
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat)));
  const auto parts = g.all_gather_uneven(t);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_TRUE(at::equal(parts[0], t));
  g.barrier();
  EXPECT_EQ(g.bytes_sent(), 0);
  // Splitting a single group gives a single group, still without a process group.
  EXPECT_EQ(g.split(7).size(), 1);
}

TEST(DistGroup, DefaultConstructedGroupIsInvalid) {
  Group g;
  EXPECT_FALSE(g.valid());
  EXPECT_THROW(g.size(), c10::ValueError);
  auto t = at::ones({2});
  EXPECT_THROW(g.all_reduce_(t), c10::ValueError);
}

TEST(DistGroup, CreateValidatesArguments) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THROW(Group::create(store, 2, 2), c10::ValueError);
  EXPECT_THROW(Group::create(store, -1, 2), c10::ValueError);
  EXPECT_THROW(Group::create(store, 0, 0), c10::ValueError);
  EXPECT_THROW(Group::create(store, 0, 2, GroupOptions().timeout(std::chrono::milliseconds(0))),
               c10::ValueError);
  try {
    Group::create(store, 5, 3);
    FAIL() << "expected c10::ValueError";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rank must be in [0, 3), got 5"), std::string::npos)
        << e.what();
  }
}

TEST_P(DistGroupWorld, AllReduceSumsAndCountsRingBytes) {
  const int world = GetParam();
  run_ranks(world, [&](Group& g) {
    EXPECT_EQ(g.backend_name(), "gloo");
    auto t = at::full({5, 3}, static_cast<float>(g.rank() + 1));
    g.all_reduce_(t);
    EXPECT_TRUE(at::equal(t, at::full({5, 3}, static_cast<float>(world * (world + 1) / 2))));
    // 60 bytes, ring model: 2·(p−1)/p·N.
    EXPECT_EQ(g.bytes_sent(), 2 * (world - 1) * 60 / world);
    g.reset_bytes_sent();
    EXPECT_EQ(g.bytes_sent(), 0);
    // bf16 is reduced in fp32 and written back.
    auto h = at::full({4}, 0.5, at::kBFloat16);
    g.all_reduce_(h);
    EXPECT_EQ(h.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(h.to(at::kFloat), at::full({4}, 0.5f * static_cast<float>(world))));
  });
}

TEST_P(DistGroupWorld, AllGatherUnevenReturnsEveryRanksRows) {
  const int world = GetParam();
  run_ranks(world, [&](Group& g) {
    // Rank r holds r+1 rows (rank 0 one row), every row filled with r.
    auto mine = at::full({g.rank() + 1, 3}, static_cast<double>(g.rank()), at::kDouble);
    const auto parts = g.all_gather_uneven(mine);
    ASSERT_EQ(static_cast<int>(parts.size()), world);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(at::equal(parts[static_cast<size_t>(r)],
                            at::full({r + 1, 3}, static_cast<double>(r), at::kDouble)))
          << "part " << r << " on rank " << g.rank();
    }
    // bf16 travels bit-exact.
    auto b = at::full({2}, 1.0 / 3.0, at::kBFloat16);
    const auto gathered = g.all_gather(b);
    for (const auto& p : gathered) EXPECT_TRUE(at::equal(p, b));
  });
}

TEST(DistGroup, AllGatherUnevenShapeMismatchRaisesOnEveryRank) {
  const auto errors = run_ranks_collect(3, [](Group& g) {
    // Rank 2 disagrees in dim 1: every rank must raise, none may hang.
    auto mine = at::zeros({2, g.rank() == 2 ? 4 : 3});
    g.all_gather_uneven(mine);
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find("only dim 0 may differ"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

TEST_P(DistGroupWorld, BroadcastAndBarrier) {
  const int world = GetParam();
  run_ranks(world, [&](Group& g) {
    auto t = g.rank() == world - 1 ? at::arange(4, at::kFloat) : at::zeros({4});
    g.broadcast_(t, world - 1);
    EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
    g.barrier();
    EXPECT_EQ(g.bytes_sent(), g.rank() == world - 1 ? 16 : 0);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, DistGroupWorld, ::testing::Values(2, 3, 4));

TEST(DistGroup, MeshSplitsTensorParallelFastest) {
  run_ranks(4, [](Group& g) {
    auto [dp, tp] = g.mesh(2, 2);
    EXPECT_EQ(tp.size(), 2);
    EXPECT_EQ(dp.size(), 2);
    // tp: {0,1} {2,3}; dp: {0,2} {1,3}.
    const int tp_base = (g.rank() / 2) * 2;
    EXPECT_EQ(tp.world_ranks(), (std::vector<int>{tp_base, tp_base + 1}));
    EXPECT_EQ(dp.world_ranks(), (std::vector<int>{g.rank() % 2, g.rank() % 2 + 2}));
    EXPECT_EQ(tp.rank(), g.rank() % 2);
    EXPECT_EQ(dp.rank(), g.rank() / 2);
    auto t = at::full({1}, static_cast<float>(g.rank()));
    tp.all_reduce_(t);
    EXPECT_EQ(t.item<float>(), static_cast<float>(2 * tp_base + 1));
    auto u = at::full({1}, static_cast<float>(g.rank()));
    dp.all_reduce_(u);
    EXPECT_EQ(u.item<float>(), static_cast<float>(2 * (g.rank() % 2) + 2));
    // Sub-groups count their own bytes.
    EXPECT_EQ(tp.bytes_sent(), 4);
    // A colour of one rank is a single-rank group without a process group.
    auto alone = g.split(g.rank() == 3 ? 1 : 0);
    EXPECT_EQ(alone.size(), g.rank() == 3 ? 1 : 3);
    EXPECT_EQ(alone.backend_name(), g.rank() == 3 ? "none" : "gloo");
    // Rank 3 has no process group to create: it must not tear its groups
    // down while the others are still connecting theirs.
    g.barrier();
  });
}

TEST(DistGroup, MeshRejectsWrongFactors) {
  const auto errors = run_ranks_collect(2, [](Group& g) { g.mesh(3, 1); });
  for (const auto& e : errors) EXPECT_NE(e.find("dp × tp must equal the group size 2"), std::string::npos) << e;
}

TEST(DistGroup, DeadRankMakesOthersTimeOut) {
  // Rank 1 creates its group and returns without entering the collective;
  // its group is kept alive (sockets open), so rank 0 can only notice through
  // the timeout. Both threads end: the test cannot hang.
  constexpr auto kTimeout = std::chrono::milliseconds(2000);
  std::mutex mu;
  std::vector<Group> keep_alive;
  double elapsed_s = -1;
  const auto errors = run_ranks_collect(
      2,
      [&](Group& g) {
        if (g.rank() == 1) {
          std::lock_guard<std::mutex> lock(mu);
          keep_alive.push_back(g);
          return;
        }
        auto t = at::ones({8});
        const auto start = std::chrono::steady_clock::now();
        try {
          g.all_reduce_(t);
        } catch (...) {
          elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          throw;
        }
      },
      GroupOptions().timeout(kTimeout));
  EXPECT_TRUE(errors[1].empty()) << errors[1];
  EXPECT_NE(errors[0].find("all_reduce on group 'world' (rank 0 of 2, timeout 2000 ms) failed"),
            std::string::npos)
      << errors[0];
  // It waited for the timeout (not a spurious early failure) and not much more.
  EXPECT_GE(elapsed_s, 1.5);
  EXPECT_LT(elapsed_s, 2.0 + 3.0);
}

// ---- init_from_env -------------------------------------------------------------


std::string init_error(std::vector<std::pair<std::string, std::string>> vars) {
  muon::test::ScopedRendezvousEnv guard(std::move(vars));
  try {
    muon::distributed::init_from_env();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(DistInitFromEnv, MissingOrInconsistentVariablesRaiseNamingThem) {
  EXPECT_NE(init_error({}).find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(init_error({{"WORLD_SIZE", "2"}}).find("RANK is not set"), std::string::npos);
  EXPECT_NE(init_error({{"WORLD_SIZE", "two"}, {"RANK", "0"}})
                .find("WORLD_SIZE must be an integer, got 'two'"),
            std::string::npos);
  EXPECT_NE(init_error({{"WORLD_SIZE", "2"}, {"RANK", "2"}})
                .find("RANK must be < WORLD_SIZE (2), got 2"),
            std::string::npos);
  EXPECT_NE(init_error({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "1"}})
                .find("LOCAL_RANK (1) must be <= RANK (0)"),
            std::string::npos);
  EXPECT_NE(init_error({{"WORLD_SIZE", "2"}, {"RANK", "1"}}).find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(init_error({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT must be in [1, 65535], got 70000"),
            std::string::npos);
}

TEST(DistInitFromEnv, WorldSizeOneIsTheSingleRankGroup) {
  muon::test::ScopedRendezvousEnv guard({{"WORLD_SIZE", "1"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}});
  auto g = muon::distributed::init_from_env();
  EXPECT_EQ(g.size(), 1);
  EXPECT_EQ(g.backend_name(), "none");
}

}  // namespace
