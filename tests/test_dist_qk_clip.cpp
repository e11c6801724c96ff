// QK-clip over a Layout (muon/distributed/layouts/qk_clip.h) in every layout at 2
// and 4 ranks, ranks as threads over real Gloo groups: the maxima are
// all-reduced with MAX (every rank passes different ones and all end with
// the γ of their maximum), and every rank's parameter rows and master rows
// equal, bit for bit, the rows of one process's clip of the whole weights
// (muon::qk_clip_, tested against the fp64 formula in test_qk_clip.cpp):
// none and layer-wise (whole weights), tensor parallel by query groups,
// sharded (row shards that cut heads; master rows rescaled, so a step after
// the clip steps from the clipped weights), and 2-D.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dist_util.h"
#include "muon/config.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/qk_clip.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/qk_clip.h"

namespace muon::test {
namespace {

using muon::distributed::Group;
using muon::distributed::Layout;
using muon::distributed::LayoutGroups;
using Named = torch::OrderedDict<std::string, at::Tensor>;

constexpr int64_t kWidth = 10;
constexpr int64_t kHeadDim = 3;
// Layer 0: a fused QKV weight, 8 query heads in 4 groups, grouped rows
// ((8 + 2·4)·3 = 48 rows; a tensor-parallel rank of 2 or 4 holds whole groups).
// Layer 1: separate q and k weights, 6 query heads in 3 groups: 18 and 9
// rows, whose row shards over 2 and 4 ranks cut heads (q: 5|5|4|4 rows at
// 4 ranks; k: 5|4 at 2 ranks).
QkClipOptions layer0() { return QkClipOptions(8, kHeadDim).num_kv_heads(4).threshold(2.0); }
QkClipOptions layer1() {
  return QkClipOptions(6, kHeadDim).num_kv_heads(3).threshold(2.0).alpha(0.3);
}

const std::vector<ParamSpec> kParams{
    {"attn0.qkv", {48, kWidth}}, {"attn1.q", {18, kWidth}}, {"attn1.k", {9, kWidth}}, {"mlp", {7, kWidth}}};

Named whole_params() { return seeded_params(kParams, 50); }

// The parameters with rows [begin, begin + rows) of the fused weight (a
// tensor-parallel block of it), the rest whole.
Named params_with_qkv_rows(int64_t begin, int64_t rows) {
  auto whole = whole_params();
  Named named;
  for (const auto& item : whole) {
    auto p = item.key() == "attn0.qkv" ? item.value().detach().narrow(0, begin, rows).clone()
                                       : item.value().detach().clone();
    named.insert(item.key(), p.requires_grad_(true));
  }
  return named;
}

// Rank r's maxima: the global maxima below (groups 0 and 2 of layer 0 and
// group 1 of layer 1 above τ = 2) on rank (h mod world), lower values
// elsewhere, so only the MAX over the ranks gives them.
at::Tensor global_max(int layer) {
  return layer == 0 ? at::tensor({1.0, 5.0, 0.5, 1.9, 2.5, 0.2, 1.2, 1.0}, at::kDouble)
                    : at::tensor({1.5, 0.3, 7.0, 2.0, -0.5, 1.9}, at::kDouble);
}
at::Tensor rank_max(int layer, int rank, int world) {
  auto m = global_max(layer).clone();
  for (int64_t h = 0; h < m.numel(); ++h) {
    if (h % world != rank) m[h] = m[h].item<double>() - 0.75 - 0.1 * rank;
  }
  return m;
}

// One process: the whole weights clipped with the global maxima.
Named one_process(const Named& start) {
  Named p;
  for (const auto& item : start) p.insert(item.key(), item.value().detach().clone());
  qk_clip_({QkClipWeight(p["attn0.qkv"], QkvRows::kGrouped)}, global_max(0), layer0());
  qk_clip_(p["attn1.q"], p["attn1.k"], global_max(1), layer1());
  return p;
}

OptimizerConfig config(const std::string& layout) {
  OptimizerConfig c;
  c.set("optimizer", "muon").set("lr", 0.02).set("layout", layout);
  return c;
}

// The clip of one step on every rank; returns γ of both layers.
std::vector<at::Tensor> clip(Layout& layout, const Group& world, int64_t qkv_row_begin) {
  return {distributed::qk_clip_(layout, {{"attn0.qkv", QkvRows::kGrouped, qkv_row_begin}},
                         rank_max(0, world.rank(), world.size()), layer0(), world),
          distributed::qk_clip_(layout, {{"attn1.q", QkvRows::kQuery, 0}, {"attn1.k", QkvRows::kKey, 0}},
                         rank_max(1, world.rank(), world.size()), layer1(), world)};
}

void expect_gamma(const std::vector<at::Tensor>& gamma) {
  EXPECT_TRUE(at::equal(gamma[0], qk_clip_gamma(global_max(0), layer0())));
  EXPECT_TRUE(at::equal(gamma[1], qk_clip_gamma(global_max(1), layer1())));
  EXPECT_LT(gamma[0][1].item<double>(), 1.0);
  EXPECT_EQ(gamma[0][2].item<double>(), 1.0);
}

class DistQkClip : public ::testing::TestWithParam<int> {};

// none and layerwise hold the whole weights on every rank.
TEST_P(DistQkClip, WholeWeightsInNoneAndLayerwise) {
  const int world = GetParam();
  const auto expected = one_process(whole_params());
  for (const std::string kind : {"none", "layerwise"}) {
    run_ranks(world, [&](Group& group) {
      auto named = whole_params();
      Layout layout(named, config(kind), LayoutGroups().world(group));
      expect_gamma(clip(layout, group, 0));
      for (const auto& item : expected) {
        EXPECT_TRUE(at::equal(named[item.key()], item.value())) << kind << " " << item.key();
      }
    });
  }
}

// Tensor parallel by query groups: rank r holds groups [r·4/p, (r+1)·4/p)
// of the fused weight, a block of rows; it passes its heads' maxima and −∞
// for the others, and the MAX over the TP ranks gives every head's.
TEST_P(DistQkClip, TensorParallelByGroups) {
  const int world = GetParam();
  const auto expected = one_process(whole_params());
  run_ranks(world, [&](Group& group) {
    const int64_t rows = 48 / world;
    const int64_t begin = rows * group.rank();
    auto named = params_with_qkv_rows(begin, rows);
    distributed::TensorParallelShards tp;
    tp.emplace("attn0.qkv", distributed::TensorParallelShard({48, kWidth}, 0, group));
    Layout layout(named, config("tensor_parallel"),
                  LayoutGroups().world(group).dp(Group::single()).tensor_parallel(tp));
    // Layer 0's maxima: this rank's heads only (its groups' query heads).
    const int64_t heads = 8 / world;
    auto mine = at::full({8}, -INFINITY, at::kDouble);
    mine.narrow(0, heads * group.rank(), heads)
        .copy_(global_max(0).narrow(0, heads * group.rank(), heads));
    const auto g0 =
        distributed::qk_clip_(layout, {{"attn0.qkv", QkvRows::kGrouped, begin}}, mine, layer0(), group);
    const auto g1 =
        distributed::qk_clip_(layout, {{"attn1.q", QkvRows::kQuery}, {"attn1.k", QkvRows::kKey}},
                       rank_max(1, group.rank(), world), layer1(), group);
    expect_gamma({g0, g1});
    EXPECT_TRUE(at::equal(named["attn0.qkv"], expected["attn0.qkv"].narrow(0, begin, rows)));
    for (const auto* name : {"attn1.q", "attn1.k", "mlp"}) {
      EXPECT_TRUE(at::equal(named[name], expected[name])) << name;
    }
  });
}

// Sharded: each rank holds the whole weights and master rows of them (row
// shards that cut heads); both are clipped. A step after the clip then
// steps from the clipped master rows: the parameters equal those of a
// layout of one process that clipped and stepped the same way, within the
// sharded layout's agreement with one process (fp32 sums in another order:
// a few ulps of an update, far below 1e-5; an unclipped master would put
// the unclipped weights back, off by 1 − γ^α ≈ 0.2 here).
TEST_P(DistQkClip, ShardedMasterRowsAreClippedToo) {
  const int world = GetParam();
  const auto expected = one_process(whole_params());
  const auto grads = seeded_params(kParams, 70);
  // One process: clip, then a step with the same gradient.
  auto single = whole_params();
  {
    Layout layout(single, config("sharded"), LayoutGroups().world(Group::single()));
    distributed::qk_clip_(layout, {{"attn0.qkv", QkvRows::kGrouped}}, global_max(0), layer0());
    distributed::qk_clip_(layout, {{"attn1.q", QkvRows::kQuery}, {"attn1.k", QkvRows::kKey}},
                   global_max(1), layer1());
    for (const auto& item : single) item.value().mutable_grad() = grads[item.key()].detach();
    layout.step();
  }
  run_ranks(world, [&](Group& group) {
    auto named = whole_params();
    Layout layout(named, config("sharded"), LayoutGroups().world(group));
    expect_gamma(clip(layout, group, 0));
    const auto& shards = layout.checkpoint_parameters();
    for (const auto& item : expected) {
      EXPECT_TRUE(at::equal(named[item.key()], item.value())) << item.key();
      // This rank's master rows: the same rows of the clipped weight.
      const auto& shard = shards[item.key()];
      const int64_t offset =
          distributed::split_offset(distributed::balanced_split_sizes(item.value().size(0), world), group.rank());
      EXPECT_TRUE(at::equal(shard, item.value().narrow(0, offset, shard.size(0)))) << item.key();
    }
    for (const auto& item : named) item.value().mutable_grad() = grads[item.key()].detach();
    layout.step();
    for (const auto& item : single) {
      const double err =
          (named[item.key()].detach() - item.value().detach()).abs().max().item<double>() /
          item.value().abs().max().item<double>();
      EXPECT_LE(err, 1e-5) << item.key();
    }
  });
}

// 2-D: tensor parallel inside (2 ranks, groups of the fused weight),
// sharded outside (world / 2 ranks): master rows of each block clipped.
TEST_P(DistQkClip, TwoDimensionalBlocksAndMasterRows) {
  const int world = GetParam();
  if (world < 4) GTEST_SKIP() << "2-D needs 2 x 2 ranks";
  const auto expected = one_process(whole_params());
  run_ranks(world, [&](Group& group) {
    auto [dp, tp] = group.mesh(world / 2, 2);
    const int64_t rows = 24;
    const int64_t begin = rows * tp.rank();
    auto named = params_with_qkv_rows(begin, rows);
    distributed::TensorParallelShards blocks;
    blocks.emplace("attn0.qkv", distributed::TensorParallelShard({48, kWidth}, 0, tp));
    Layout layout(named, config("sharded"),
                  LayoutGroups().world(group).dp(dp).tensor_parallel(blocks));
    EXPECT_EQ(layout.describe(), "2-D 2 x 2");
    expect_gamma(clip(layout, group, begin));
    EXPECT_TRUE(at::equal(named["attn0.qkv"], expected["attn0.qkv"].narrow(0, begin, rows)));
    const auto& shard = layout.checkpoint_parameters()["attn0.qkv"];
    const auto sizes = distributed::balanced_split_sizes(rows, dp.size());
    EXPECT_TRUE(
        at::equal(shard, expected["attn0.qkv"].narrow(
                             0, begin + distributed::split_offset(sizes, dp.rank()), shard.size(0))));
  });
}

// Tensors outside a Layout: each rank its row shard of the fused weight
// (edges cutting heads: 48 rows over 4 ranks at offsets 0, 13, 29, 37; over
// 2 at 0, 13), its own maxima; the MAX over the group gives every rank the
// γ and its rows of one process's clip.
TEST_P(DistQkClip, TensorsOutsideALayout) {
  const int world = GetParam();
  const auto expected = one_process(whole_params());
  run_ranks(world, [&](Group& group) {
    const std::vector<int64_t> cuts =
        world == 4 ? std::vector<int64_t>{0, 13, 29, 37, 48} : std::vector<int64_t>{0, 13, 48};
    const int64_t begin = cuts[static_cast<size_t>(group.rank())];
    const int64_t rows = cuts[static_cast<size_t>(group.rank()) + 1] - begin;
    auto mine = whole_params()["attn0.qkv"].detach().narrow(0, begin, rows).clone();
    const auto gamma = distributed::qk_clip_({QkClipWeight(mine, QkvRows::kGrouped, begin)},
                                      rank_max(0, group.rank(), world), layer0(), group);
    EXPECT_TRUE(at::equal(gamma, qk_clip_gamma(global_max(0), layer0())));
    EXPECT_TRUE(at::equal(mine, expected["attn0.qkv"].narrow(0, begin, rows)));
  });
}

// Errors: the same c10::ValueError on every rank, nothing changed.
TEST_P(DistQkClip, ErrorsAreNamedOnEveryRankAndChangeNothing) {
  const int world = GetParam();
  const auto errors = run_ranks_collect(world, [&](Group& group) {
    auto named = whole_params();
    const auto before = named["attn0.qkv"].detach().clone();
    Layout layout(named, config("sharded"), LayoutGroups().world(group));
    const auto shard_before = layout.checkpoint_parameters()["attn0.qkv"].clone();
    auto expect_error = [&](const std::function<void()>& call, const std::string& needle) {
      try {
        call();
        ADD_FAILURE() << "no error for " << needle;
      } catch (const c10::ValueError& e) {
        EXPECT_NE(std::string(e.what_without_backtrace()).find(needle), std::string::npos)
            << e.what_without_backtrace();
      }
      EXPECT_TRUE(at::equal(named["attn0.qkv"], before));
      EXPECT_TRUE(at::equal(layout.checkpoint_parameters()["attn0.qkv"], shard_before));
    };
    // Maxima NaN on one rank only: after the MAX every rank sees the NaN.
    auto nan_on_one = rank_max(0, group.rank(), world);
    if (group.rank() == world - 1) nan_on_one[3] = NAN;
    expect_error(
        [&] {
          distributed::qk_clip_(layout, {{"attn0.qkv", QkvRows::kGrouped}}, nan_on_one, layer0(), group);
        },
        "max_logits[3] must be finite, got nan");
    expect_error(
        [&] {
          distributed::qk_clip_(layout, {{"attn0.qkv", QkvRows::kGrouped}, {"attn9", QkvRows::kKey}},
                         global_max(0), layer0(), group);
        },
        "params[1]: the layout has no parameter named 'attn9'");
    expect_error(
        [&] {
          distributed::qk_clip_(layout,
                         {{"attn0.qkv", QkvRows::kGrouped}, {"attn1.q", QkvRows::kQuery, 7}},
                         global_max(0), layer0(), group);
        },
        "params[1] 'attn1.q' holds rows [7, 25) of a query weight of 24 rows");
    expect_error(
        [&] {
          distributed::qk_clip_(layout, {{"attn0.qkv", QkvRows::kGrouped}}, global_max(0),
                         QkClipOptions(layer0()).alpha(2), group);
        },
        "alpha must be in [0, 1], got 2");
    expect_error([&] { layout.scale_rows("attn0.qkv", at::ones({5}, at::kDouble)); },
                 "scale_rows: factors of 'attn0.qkv' must be 1-D with one element per row (48)");
    expect_error([&] { layout.scale_rows("nope", at::ones({5}, at::kDouble)); },
                 "scale_rows: no parameter named 'nope'");
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, DistQkClip, ::testing::Values(2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace muon::test
