// Ranks that disagree: every layout compares the settings, parameters and
// layout of its ranks at construction and raises the same error on every
// rank naming the first difference; replicated parameters start equal.
// Ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <torch/optim/adamw.h>

#include <string>
#include <vector>

#include "dist_util.h"
#include "muon/config.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/runtime/agreement.h"
#include "muon/optim/hybrid.h"

namespace muon::test {
namespace {

using distributed::AgreementItem;
using distributed::Group;
using Named = torch::OrderedDict<std::string, at::Tensor>;

// Every rank threw, and every message holds each of `parts`.
void expect_everywhere(const RankErrors& errors, const std::vector<std::string>& parts) {
  for (size_t r = 0; r < errors.size(); ++r) {
    ASSERT_FALSE(errors[r].empty()) << "rank " << r << " did not throw";
    for (const auto& part : parts) {
      EXPECT_NE(errors[r].find(part), std::string::npos)
          << "rank " << r << ": '" << part << "' not in: " << errors[r];
    }
  }
}

// A small model, identical on every rank unless a rank changes it.
Named model(int64_t width = 16) {
  Named named;
  named.insert("wte.weight", seeded_randn({24, width}, 1).set_requires_grad(true));
  named.insert("blocks.0.attn.w", seeded_randn({width, width}, 2).set_requires_grad(true));
  named.insert("blocks.0.mlp.w", seeded_randn({2 * width, width}, 3).set_requires_grad(true));
  named.insert("lm_head.weight", seeded_randn({24, width}, 4).set_requires_grad(true));
  return named;
}

distributed::InnerOptimizerFactory hybrid(double muon_lr) {
  return [muon_lr](const Named& owned) -> std::unique_ptr<torch::optim::Optimizer> {
    MuonWithAdamWOptions o;
    o.muon(MuonOptions(muon_lr));
    o.adamw(torch::optim::AdamWOptions(1e-3));
    return std::make_unique<MuonWithAdamW>(owned, o);
  };
}

TEST(RanksAgree, EqualItemsPassAndTheFirstDifferenceIsNamedTheSameEverywhere) {
  run_ranks(3, [](Group& group) {
    distributed::check_ranks_agree(group, {{"lr of param group 0", "0.02"}, {"momentum", "0.95"}},
                            "[test] ", "hint");
  });
  // Rank 2 differs in two items: the first (in order) is named, against rank 0.
  const auto errors = run_ranks_collect(3, [](Group& group) {
    const bool odd = group.rank() == 2;
    distributed::check_ranks_agree(group,
                            {{"steps", "5"},
                             {"lr of param group 0", odd ? "0.01" : "0.02"},
                             {"momentum", odd ? "0.9" : "0.95"}},
                            "[test] ", "use one config");
  });
  expect_everywhere(errors, {"[test] the ranks of group", "lr of param group 0 is 0.01 on rank 2, "
                             "0.02 on rank 0; use one config"});
  for (const auto& e : errors) EXPECT_EQ(e.find("momentum"), std::string::npos) << e;
  // A rank with fewer items names the first one it lacks.
  const auto missing = run_ranks_collect(2, [](Group& group) {
    std::vector<AgreementItem> items{{"parameter 'a'", "shape [2]"}};
    if (group.rank() == 0) items.push_back({"parameter 'b'", "shape [3]"});
    distributed::check_ranks_agree(group, items, "[test] ", "same model");
  });
  expect_everywhere(missing, {"rank 1 lists 1, rank 0 lists 2",
                              "the first missing on rank 1 is parameter 'b' (shape [3])"});
  // Values are clipped in the message.
  const auto long_value = run_ranks_collect(2, [](Group& group) {
    distributed::check_ranks_agree(group, {{"x", std::string(100000, group.rank() == 0 ? 'a' : 'b')}},
                            "[test] ", "h");
  });
  for (const auto& e : long_value) EXPECT_LT(e.size(), 1000u) << e.size();
}

TEST(RanksAgree, LayerwiseNamesAnotherLearningRate) {
  // The case that trained apart silently: rank 1 built with lr 0.01.
  const auto errors = run_ranks_collect(2, [](Group& group) {
    auto named = model();
    distributed::LayerwiseOptimizer opt(named, group, hybrid(group.rank() == 1 ? 0.01 : 0.02));
  });
  expect_everywhere(errors, {"[muon::distributed::LayerwiseOptimizer]", "lr of param group ",
                             " is 0.01 on rank 1, 0.02 on rank 0", "same settings"});
}

TEST(RanksAgree, LayerwiseNamesAParameterOfAnotherShape) {
  const auto errors = run_ranks_collect(2, [](Group& group) {
    auto named = model();
    if (group.rank() == 1) named["blocks.0.attn.w"] = seeded_randn({16, 8}, 2).set_requires_grad(true);
    distributed::LayerwiseOptimizer opt(named, group, hybrid(0.02));
  });
  expect_everywhere(errors, {"parameter 'blocks.0.attn.w' is shape [16, 8], Float on rank 1, "
                             "shape [16, 16], Float on rank 0"});
}

TEST(RanksAgree, LayerwiseNamesTheLayoutOptions) {
  const auto errors = run_ranks_collect(2, [](Group& group) {
    auto named = model();
    distributed::LayerwiseOptimizer opt(named, group, hybrid(0.02),
                                 distributed::LayerwiseOptions().max_in_flight(group.rank() == 1 ? 0 : 2));
  });
  expect_everywhere(errors, {"max_in_flight of the layer-wise layout is 0 on rank 1, 2 on rank 0"});
}

TEST(RanksAgree, ReplicatedParametersMustStartEqual) {
  // Another seed on rank 1: the first parameter whose values differ is named.
  const auto errors = run_ranks_collect(2, [](Group& group) {
    auto named = model();
    if (group.rank() == 1) named["blocks.0.mlp.w"].detach().add_(1e-6);
    distributed::LayerwiseOptimizer opt(named, group, hybrid(0.02));
  });
  expect_everywhere(errors, {"the checksum of the values of parameter 'blocks.0.mlp.w' is ",
                             "broadcast_parameters"});
  // Broadcast from rank 0 first (as DDP does), and the same ranks build it.
  run_ranks(2, [](Group& group) {
    auto named = model();
    if (group.rank() == 1) {
      for (auto& item : named) item.value().detach().normal_();
    }
    distributed::broadcast_parameters(named, group);
    const auto reference = model();
    for (const auto& item : named) EXPECT_TRUE(at::equal(item.value(), reference[item.key()])) << item.key();
    distributed::LayerwiseOptimizer opt(named, group, hybrid(0.02));
  });
}

TEST(RanksAgree, BroadcastNamesAModelOfAnotherShape) {
  const auto errors = run_ranks_collect(2, [](Group& group) {
    auto named = model(group.rank() == 1 ? 8 : 16);
    distributed::broadcast_parameters(named, group);
  });
  expect_everywhere(errors, {"[muon::distributed::broadcast_parameters]",
                             "parameter 'wte.weight' is shape [24, 8], Float on rank 1, "
                             "shape [24, 16], Float on rank 0"});
}

TEST(RanksAgree, MakeOptimizerNamesTheConfigField) {
  const auto errors = run_ranks_collect(2, [](Group& group) {
    auto named = model();
    OptimizerConfig config;
    config.set("optimizer", "muon").set("layout", "layerwise");
    config.set("lr", group.rank() == 1 ? 0.01 : 0.02);
    distributed::DistributedLayout layout;
    layout.group = group;
    distributed::make_optimizer(named, config, layout);
  });
  expect_everywhere(errors, {"[muon::distributed::make_optimizer]", "config field 'lr' is 0.01 on rank 1, "
                             "0.02 on rank 0"});
}

TEST(RanksAgree, ShardedNamesTheMomentum) {
  const auto errors = run_ranks_collect(2, [](Group& group) {
    // Rows 4r..4r+3 of one 8 × 4 matrix on each rank.
    auto p = seeded_randn({8, 4}, 5).narrow(0, 4 * group.rank(), 4).clone().requires_grad_(true);
    distributed::ShardedMuon opt(std::vector<at::Tensor>{p}, {distributed::RowShard({8, 4}, group)},
                          MuonOptions(0.02).momentum(group.rank() == 1 ? 0.9 : 0.95));
  });
  expect_everywhere(errors, {"[muon::distributed::ShardedMuon]", "momentum of param group 0 is 0.9 on "
                             "rank 1, 0.95 on rank 0"});
}

TEST(RanksAgree, TensorParallelNamesTheNewtonSchulzSteps) {
  const auto errors = run_ranks_collect(2, [](Group& group) {
    auto p = seeded_randn({8, 4}, 6).narrow(0, 4 * group.rank(), 4).clone().requires_grad_(true);
    distributed::TensorParallelOptions tp;
    tp.shard(p, distributed::TensorParallelShard({8, 4}, 0, group));
    MuonOptions o(0.02);
    o.ns().steps(group.rank() == 1 ? 4 : 5);
    distributed::TensorParallelMuon opt(std::vector<at::Tensor>{p}, o, tp);
  });
  expect_everywhere(errors, {"[muon::distributed::TensorParallelMuon]",
                             "ns_steps of the param group of sharded parameter 0 is 4 on rank 1, "
                             "5 on rank 0"});
}

TEST(RanksAgree, TwoDimensionalLayoutRaisesOnEveryRank) {
  // A 2 × 2 mesh; world rank 3 alone has another lr. Its data-parallel group
  // disagrees; the other ranks learn it through their tensor-parallel peers.
  const auto errors = run_ranks_collect(4, [](Group& world) {
    const auto [dp, tp] = world.mesh(2, 2);
    // An 8 × 8 matrix: rows split over TP (4 each), then over DP (2 each).
    auto block = seeded_randn({8, 8}, 7).narrow(0, 4 * tp.rank(), 4);
    auto p = block.narrow(0, 2 * dp.rank(), 2).clone().requires_grad_(true);
    distributed::ShardedMuon opt(
        std::vector<at::Tensor>{p},
        {distributed::RowShard({4, 8}, dp).tensor_parallel(distributed::TensorParallelShard({8, 8}, 0, tp),
                                                    distributed::TensorParallelMode::kDuplicated)},
        MuonOptions(world.rank() == 3 ? 0.01 : 0.02));
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find("[muon::distributed::ShardedMuon]"), std::string::npos) << r << ": " << errors[r];
  }
  // World ranks 1 and 3 (ranks 0 and 1 of one data-parallel group) name the
  // difference; ranks 0 and 2 name the peer that found it.
  for (const size_t r : {1, 3}) {
    EXPECT_NE(errors[r].find("lr of param group 0 is 0.01 on rank 1, 0.02 on rank 0"),
              std::string::npos)
        << errors[r];
  }
  for (const size_t r : {0, 2}) {
    EXPECT_NE(errors[r].find("found a difference in its data-parallel group"), std::string::npos)
        << errors[r];
  }
}

}  // namespace
}  // namespace muon::test
