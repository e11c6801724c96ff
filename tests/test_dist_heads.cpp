// Per-head Newton–Schulz (MuonOptions::num_heads) in every layout, world
// sizes 2 and 4, against one process on the whole matrices:
//  - tensor parallel, column-parallel blocks of whole heads (the main job's
//    fused QKV, rows per head [q_h, k_h, v_h], TP by heads): each rank
//    orthogonalizes its own heads with no communication, bit for bit one
//    process's values in every mode (duplicated, distributed, blockwise);
//  - tensor parallel, row-parallel blocks (columns split): duplicated gathers
//    the matrix and orthogonalizes its heads as one process does (bit for
//    bit), distributed runs one distributed Newton–Schulz per head (equal to
//    rounding), blockwise each block's heads (one process on the blocks);
//  - heads that straddle the ranks of a row split: a ValueError naming it;
//  - row shards (owner-compute, replicated), the 2-D layout and layerwise:
//    the whole matrix (a TP block in 2-D) splits into heads where it is
//    gathered.
// Ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dist_util.h"
#include "expect_util.h"
#include "layout_harness.h"
#include "muon/config.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_layers.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/registry.h"

namespace muon::test {
namespace {

using muon::distributed::Group;
using muon::distributed::RowShard;
using torch::optim::OptimizerParamGroup;
using Part = std::function<at::Tensor(size_t, const at::Tensor&)>;

constexpr int64_t kSteps = 3;
constexpr int64_t kHeads = 4;

// Each with the dimension tensor-parallel blocks split (layout_harness.h).
// The main job's fused QKV: 4 heads of head_dim 3, rows per head
// [q_h, k_h, v_h] (9 rows), width 12, column parallel (TP by heads: 2 or 4
// ranks hold 2 or 1 whole heads); an output projection, row parallel.
const std::vector<layouts::Matrix> kModel{{{36, 12}, 0}, {{16, 20}, 1}};

at::Tensor full_param(size_t k) { return seeded_randn(kModel[k].shape, 70 + k); }
at::Tensor full_grad(size_t k, int64_t step) {
  return seeded_randn(kModel[k].shape, 700 + 13 * static_cast<uint64_t>(step) + k);
}

MuonOptions options() { return MuonOptions(0.02).weight_decay(0.1).num_heads(kHeads); }

using layouts::block_of;

// kSteps of `opt` over `params`, each gradient the part `part` of the whole one.
void run_steps(torch::optim::Optimizer& opt, std::vector<at::Tensor>& params, const Part& part) {
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = part(k, full_grad(k, s));
    opt.step();
  }
}

std::vector<at::Tensor> single_process() {
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < kModel.size(); ++k) params.push_back(full_param(k).requires_grad_(true));
  Muon opt(params, options());
  run_steps(opt, params, [](size_t, const at::Tensor& t) { return t; });
  return params;
}

// `exact`: the same arithmetic as one process on the same values (whole
// heads on the rank, or the whole matrix gathered): identical bits. Else the
// order of fp32 sums differs (distributed Newton–Schulz's Gram matrices):
// a few ulps per update, below 1e-5 of the parameters after three steps,
// while the whole matrix orthogonalized instead of its heads is off by ~1e-2.
void expect_part(const at::Tensor& got, const at::Tensor& expected, const at::Tensor& whole,
                 bool exact, const std::string& what) {
  if (expected.numel() == 0) return;
  if (exact) {
    EXPECT_TRUE(at::equal(got.detach(), expected))
        << what << ": max diff " << (got.detach() - expected).abs().max().item<double>();
    return;
  }
  const double err =
      (got.detach() - expected).abs().max().item<double>() / whole.abs().max().item<double>();
  EXPECT_LE(err, 1e-5) << what;
}

TEST(HeadsLayouts, TensorParallelEqualsOneProcess) {
  const auto reference = single_process();
  for (const std::string mode : {"duplicated", "distributed"}) {
    for (const int world : {2, 4}) {
      run_ranks(world, [&](Group& group) {
        const Part part = layouts::tensor_parallel_part(kModel, group.rank(), world);
        auto params = layouts::parts_of(kModel.size(), full_param, part);
        muon::distributed::TensorParallelOptions tp;
        tp.mode(mode);
        layouts::shard_tensor_parallel(tp, params, kModel, group);
        Muon opt({OptimizerParamGroup(params)}, options(), muon::distributed::make_orthogonalizer(tp));
        run_steps(opt, params, part);
        const auto what =
            mode + " world " + std::to_string(world) + " rank " + std::to_string(group.rank());
        // Whole heads per rank: no communication, one process's bits.
        expect_part(params[0], part(0, reference[0].detach()), reference[0], true,
                    what + " QKV (TP by heads)");
        // Columns split: duplicated gathers (one process's bits), distributed sums Grams.
        expect_part(params[1], part(1, reference[1].detach()), reference[1], mode == "duplicated",
                    what + " row parallel");
      });
    }
  }
}

// The main job's tensor-parallel QKV: rows_per_rank_by_heads gives 3 ranks
// 2, 1 and 1 whole heads (18, 9, 9 rows): each rank orthogonalizes its own
// heads, one process's bits in every mode.
TEST(HeadsLayouts, MainJobQkvSplitByHeadsEqualsOneProcess) {
  const auto reference = single_process();
  const auto rows = muon::distributed::rows_per_rank_by_heads(kHeads, 9, 3);
  ASSERT_EQ(rows, (std::vector<int64_t>{18, 9, 9}));
  for (const std::string mode : {"duplicated", "distributed", "blockwise"}) {
    run_ranks(3, [&](Group& group) {
      const Part part = [&](size_t, const at::Tensor& t) {
        return muon::distributed::local_rows(t, rows, group.rank());
      };
      std::vector<at::Tensor> params{part(0, full_param(0)).requires_grad_(true)};
      muon::distributed::TensorParallelOptions tp;
      tp.mode(mode).shard(params[0], muon::distributed::TensorParallelShard(kModel[0].shape, 0, group));
      Muon opt({OptimizerParamGroup(params)}, options(), muon::distributed::make_orthogonalizer(tp));
      run_steps(opt, params, part);
      expect_part(params[0], part(0, reference[0].detach()), reference[0], true,
                  "main job QKV " + mode + " rank " + std::to_string(group.rank()));
    });
  }
}

// Blockwise: each rank's block is a matrix of its own; with whole heads per
// rank (the QKV) that is one process's per-head step; for the row-parallel
// matrix, one process on the blocks as matrices of their own.
TEST(HeadsLayouts, BlockwiseEqualsOneProcess) {
  const auto reference = single_process();
  for (const int world : {2, 4}) {
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < world; ++r)
      blocks.push_back(block_of(full_param(1), 1, r, world).requires_grad_(true));
    Muon one(blocks, options());
    for (int64_t s = 0; s < kSteps; ++s) {
      for (int r = 0; r < world; ++r)
        blocks[static_cast<size_t>(r)].mutable_grad() = block_of(full_grad(1, s), 1, r, world);
      one.step();
    }
    run_ranks(world, [&](Group& group) {
      const Part part = layouts::tensor_parallel_part(kModel, group.rank(), world);
      auto params = layouts::parts_of(kModel.size(), full_param, part);
      muon::distributed::TensorParallelOptions tp;
      tp.mode("blockwise");
      layouts::shard_tensor_parallel(tp, params, kModel, group);
      Muon opt({OptimizerParamGroup(params)}, options(), muon::distributed::make_orthogonalizer(tp));
      run_steps(opt, params, part);
      const auto what =
          "blockwise world " + std::to_string(world) + " rank " + std::to_string(group.rank());
      expect_part(params[0], part(0, reference[0].detach()), reference[0], true, what + " QKV");
      expect_part(params[1], blocks[static_cast<size_t>(group.rank())].detach(), blocks[0], true,
                  what + " row parallel");
    });
  }
}

// Heads that straddle two ranks of a row split: every rank raises at
// construction, naming the case, in every mode.
TEST(HeadsLayouts, StraddlingHeadsAreRefused) {
  for (const std::string mode : {"duplicated", "distributed", "blockwise"}) {
    run_ranks(3, [&](Group& group) {
      // 36 rows over 3 ranks: 12 each; 4 heads of 9 rows straddle.
      auto p = block_of(full_param(0), 0, group.rank(), 3).requires_grad_(true);
      muon::distributed::TensorParallelOptions tp;
      tp.mode(mode).shard(p, muon::distributed::TensorParallelShard({36, 12}, 0, group));
      expect_value_error(
          [&] { Muon({OptimizerParamGroup({p})}, options(), muon::distributed::make_orthogonalizer(tp)); },
          {"num_heads 4", "9 rows", "straddles", "[12, 12, 12]"});
    });
  }
}

TEST(HeadsLayouts, RowShardsEqualOneProcess) {
  const auto reference = single_process();
  for (const std::string mode : {"owner_compute", "replicated"}) {
    for (const int world : {2, 4}) {
      run_ranks(world, [&](Group& group) {
        // Row shards that split heads (one row moved from the last rank to
        // the first): the whole matrix is gathered first.
        const Part part = [&](size_t k, const at::Tensor& t) {
          auto rows = muon::distributed::balanced_split_sizes(kModel[k].shape[0], world);
          rows.front() += 1;
          rows.back() -= 1;
          return muon::distributed::local_rows(t, rows, group.rank());
        };
        std::vector<at::Tensor> params;
        muon::distributed::ShardedOptions so;
        so.mode(mode);
        for (size_t k = 0; k < kModel.size(); ++k) {
          params.push_back(part(k, full_param(k)).requires_grad_(true));
          so.shard(params.back(), RowShard(kModel[k].shape, group));
        }
        Muon opt({OptimizerParamGroup(params)}, options(), muon::distributed::make_orthogonalizer(so));
        run_steps(opt, params, part);
        for (size_t k = 0; k < kModel.size(); ++k) {
          // The owner (every rank, replicated) runs one process's per-head
          // Newton–Schulz on the same whole matrix.
          expect_part(params[k], part(k, reference[k].detach()), reference[k], true,
                      mode + " world " + std::to_string(world) + " rank " +
                          std::to_string(group.rank()) + " matrix " + std::to_string(k));
        }
      });
    }
  }
}

TEST(HeadsLayouts, TwoDimensionalEqualsOneProcess) {
  const auto reference = single_process();
  for (const auto tp_mode : {muon::distributed::TensorParallelMode::kDuplicated,
                             muon::distributed::TensorParallelMode::kDistributed}) {
    run_ranks(4, [&](Group& world) {
      const auto [dp, tp] = world.mesh(2, 2);
      const Part part = layouts::two_d_part(kModel, dp, tp);
      auto params = layouts::parts_of(kModel.size(), full_param, part);
      muon::distributed::ShardedOptions so;
      for (size_t k = 0; k < kModel.size(); ++k) so.shard(params[k], layouts::two_d_shard(kModel[k], dp, tp, tp_mode));
      Muon opt({OptimizerParamGroup(params)}, options(), muon::distributed::make_orthogonalizer(so));
      run_steps(opt, params, part);
      const auto what =
          "2-D " + muon::distributed::to_string(tp_mode) + " rank " + std::to_string(world.rank());
      expect_part(params[0], part(0, reference[0].detach()), reference[0], true, what + " QKV");
      expect_part(params[1], part(1, reference[1].detach()), reference[1],
                  tp_mode == muon::distributed::TensorParallelMode::kDuplicated, what + " row parallel");
    });
  }
}

TEST(HeadsLayouts, LayerwiseEqualsOneProcessFromAConfig) {
  const auto reference = single_process();
  OptimizerConfig config;
  apply_config_json(config,
                    R"({"optimizer": "muon", "lr": 0.02, "weight_decay": 0.1, "muon_num_heads": 4,
                                "muon_scale_mode": "shape_scaling", "layout": "layerwise"})");
  for (const int world : {2, 4}) {
    run_ranks(world, [&](Group& group) {
      torch::OrderedDict<std::string, at::Tensor> named;
      std::vector<at::Tensor> params;
      for (size_t k = 0; k < kModel.size(); ++k) {
        params.push_back(full_param(k).requires_grad_(true));
        named.insert("blocks." + std::to_string(k) + ".weight", params.back());
      }
      muon::distributed::DistributedLayout layout;
      layout.group = group;
      auto opt = muon::distributed::make_optimizer(named, config, layout);
      run_steps(*opt, params, [](size_t, const at::Tensor& t) { return t; });
      for (size_t k = 0; k < kModel.size(); ++k) {
        expect_part(params[k], reference[k].detach(), reference[k], true,
                    "layerwise world " + std::to_string(world) + " matrix " + std::to_string(k));
      }
    });
  }
}

}  // namespace
}  // namespace muon::test
