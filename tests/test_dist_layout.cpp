// muon::distributed::Layout: one face for every layout, and one agreement per step.
// Ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dist_util.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/optim/step_guard.h"

namespace {

using muon::OptimizerConfig;
using muon::distributed::Group;
using muon::distributed::Layout;
using muon::distributed::LayoutGroups;
using Named = torch::OrderedDict<std::string, at::Tensor>;
using muon::test::seeded_randn;

// Two matrices for Muon, a vector for AdamW.
const std::vector<std::pair<std::string, std::vector<int64_t>>> kModel{
    {"blocks.0.fc.weight", {8, 6}}, {"blocks.0.proj.weight", {6, 8}}, {"blocks.0.gain", {6}}};

Named make_params() {
  Named named;
  for (size_t k = 0; k < kModel.size(); ++k) {
    auto p = seeded_randn(kModel[k].second, 10 + k);
    p.set_requires_grad(true);
    named.insert(kModel[k].first, p);
  }
  return named;
}

void set_grads(Named& named, int64_t rank, double scale = 1.0) {
  for (size_t k = 0; k < named.size(); ++k) {
    auto& p = named[k].value();
    p.mutable_grad() = seeded_randn(p.sizes().vec(), 100 + 7 * rank + k) * scale;
  }
}

OptimizerConfig config(const std::string& layout) {
  OptimizerConfig c;
  c.set("optimizer", "muon").set("lr", 0.02).set("layout", layout);
  return c;
}

// The tensor-parallel blocks of a 2-rank TP group: every matrix split by rows.
muon::distributed::TensorParallelShards tp_blocks(const Group& group) {
  muon::distributed::TensorParallelShards out;
  for (size_t k = 0; k < 2; ++k) {
    out.emplace(kModel[k].first, muon::distributed::TensorParallelShard(kModel[k].second, 0, group));
  }
  return out;
}

// The parameters a rank holds in `layout` (TP: its blocks of the matrices).
Named params_for(const std::string& layout, const Group& group) {
  auto named = make_params();
  if (layout != "tensor_parallel") return named;
  Named blocks;
  for (size_t k = 0; k < named.size(); ++k) {
    auto p = named[k].value().detach();
    if (k < 2) p = p.chunk(group.size(), 0)[static_cast<size_t>(group.rank())].clone();
    p.set_requires_grad(true);
    blocks.insert(named[k].key(), p);
  }
  return blocks;
}

LayoutGroups groups_for(const std::string& layout, const Group& group) {
  if (layout == "tensor_parallel") {
    // Every rank is in one TP group: no data parallelism.
    return LayoutGroups().world(group).dp(Group::single()).tensor_parallel(tp_blocks(group));
  }
  return LayoutGroups().world(group);
}

// Bytes one all-gather of `count` integers sends on `group`.
int64_t gather_bytes(const Group& group, size_t count) {
  group.reset_bytes_sent();
  group.all_gather_ints(std::vector<int64_t>(count, 0));
  const auto bytes = group.bytes_sent();
  group.reset_bytes_sent();
  return bytes;
}

// A step whose parameters have no gradient communicates nothing but the
// step's agreement: one all-gather of six integers and the gradient bitmask
// (one word for three parameters), in every layout. The layouts' own checks
// used to add one collective each (gradient mask, non-finite values, the
// optimizer's checks, the strategy's mask): three or four per step. (The
// layer-wise layout is left out: its step all-gathers the owners'
// parameters whatever their gradients, which is its work, not a check.)
TEST(Layout, AStepAgreesInOneSmallCollectiveInEveryLayout) {
  for (const std::string layout : {"none", "tensor_parallel", "sharded"}) {
    muon::test::run_ranks(2, [&](Group& group) {
      auto named = params_for(layout, group);
      Layout l(named, config(layout), groups_for(layout, group));
      const auto expected = gather_bytes(group, 7);
      l.zero_grad();
      l.step();
      EXPECT_EQ(group.bytes_sent(), expected) << layout;
    });
  }
}

// One rank changed a setting alone (e.g. a schedule run on one rank): every
// rank raises naming the setting, and no parameter changes.
TEST(Layout, ASettingChangedOnOneRankIsNamedOnEveryRank) {
  for (const std::string layout : {"none", "tensor_parallel", "sharded"}) {
    const auto errors = muon::test::run_ranks_collect(2, [&](Group& group) {
      auto named = params_for(layout, group);
      Layout l(named, config(layout), groups_for(layout, group));
      if (group.rank() == 1) l.optimizer().param_groups()[0].options().set_lr(0.5);
      set_grads(named, group.rank());
      std::vector<at::Tensor> before;
      for (const auto& item : named) before.push_back(item.value().detach().clone());
      try {
        l.step();
      } catch (const c10::ValueError&) {
        for (size_t k = 0; k < named.size(); ++k) EXPECT_TRUE(at::equal(named[k].value(), before[k]));
        throw;
      }
    });
    for (const auto& e : errors) {
      EXPECT_NE(e.find("lr of param group 0 is 0.5 on rank 1"), std::string::npos) << layout << ": " << e;
      EXPECT_EQ(e, errors[0]);
    }
  }
}

// Gradients that are finite on every rank but whose sum overflows float32:
// the step's agreement sees them large, the reduced gradient is checked
// again, and the step raises (or is skipped) on every rank, changing nothing.
TEST(Layout, GradientsWhoseSumOverflowsAreCaughtAfterTheReduction) {
  const double big = 0.75 * static_cast<double>(std::numeric_limits<float>::max());
  for (const std::string layout : {"none", "sharded"}) {
    for (const std::string policy : {"error", "skip_step"}) {
      const auto errors = muon::test::run_ranks_collect(2, [&](Group& group) {
        auto named = make_params();
        Layout l(named, config(layout).set("nonfinite", policy), groups_for(layout, group));
        set_grads(named, group.rank());
        named[0].value().mutable_grad().fill_(big);  // 2 · 0.75 · max overflows
        std::vector<at::Tensor> before;
        for (const auto& item : named) before.push_back(item.value().detach().clone());
        try {
          l.step();
        } catch (...) {
          for (size_t k = 0; k < named.size(); ++k) EXPECT_TRUE(at::equal(named[k].value(), before[k]));
          throw;
        }
        EXPECT_EQ(l.skipped_steps(), 1);
        for (size_t k = 0; k < named.size(); ++k) EXPECT_TRUE(at::equal(named[k].value(), before[k]));
      });
      for (const auto& e : errors) {
        if (policy == "skip_step") {
          EXPECT_TRUE(e.empty()) << e;
        } else {
          EXPECT_NE(e.find("'blocks.0.fc.weight'"), std::string::npos) << layout << ": " << e;
          EXPECT_NE(e.find("overflowed"), std::string::npos) << layout << ": " << e;
        }
      }
    }
  }
}

// Every layout trains the same parameters as one process over the averaged
// gradients (within float rounding of the reduction's summation order and
// the strategies' distributed products: 1e-5 relative for fp32 on
// unit-scale values after a few steps).
TEST(Layout, EveryLayoutStepsAsOneProcess) {
  auto whole = make_params();
  Layout single(whole, config("none"));
  for (int64_t step = 0; step < 3; ++step) {
    for (size_t k = 0; k < whole.size(); ++k) {
      whole[k].value().mutable_grad() =
          (seeded_randn(kModel[k].second, 100 + k) + seeded_randn(kModel[k].second, 107 + k)) / 2;
    }
    single.step();
  }
  for (const std::string layout : {"none", "layerwise", "sharded"}) {
    muon::test::run_ranks(2, [&](Group& group) {
      auto named = make_params();
      Layout l(named, config(layout), groups_for(layout, group));
      for (int64_t step = 0; step < 3; ++step) {
        l.zero_grad();
        set_grads(named, group.rank());
        l.step();
      }
      for (size_t k = 0; k < named.size(); ++k) {
        EXPECT_TRUE(at::allclose(named[k].value(), whole[k].value(), 1e-5, 1e-6))
            << layout << " " << named[k].key();
      }
    });
  }
}

TEST(Layout, MissingInformationRaisesNamingIt) {
  auto named = make_params();
  try {
    Layout l(named, config("none"), LayoutGroups().row_shards({{"blocks.0.fc.weight",
                                                               muon::distributed::RowShard({8, 6}, Group::single())}}));
    ADD_FAILURE() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("row_shards"), std::string::npos);
  }
  try {
    Layout l(named, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("optimizer is null"), std::string::npos);
  }
}

}  // namespace
