// AdaptiveMuon (NorMuon per row, AdaMuon per element, NAMO per matrix) in every distributed
// layout: its second-moment stage runs on each rank's part of a matrix and
// sums row statistics and norms over the other parts through the layout's
// strategy, so tensor-parallel blocks (row- or column-split, uneven, empty),
// row shards (owner-compute and replicated, uneven, padded, empty) and the
// 2-D layout all give the parameters of one process on the whole matrices.
// Ranks are threads over real Gloo groups, world sizes 1–4.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dist_util.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/optim/adaptive_muon.h"

namespace muon::test {
namespace {

using muon::distributed::Group;
using muon::distributed::RowShard;
using torch::optim::OptimizerParamGroup;

constexpr int64_t kSteps = 3;

// Each matrix with the dimension its tensor-parallel blocks split. Sizes
// that no world size of 2–4 divides evenly; 3 rows leave rank 3 of 4 with
// an empty block or shard.
struct Matrix {
  std::vector<int64_t> shape;
  int64_t dim;
};
const std::vector<Matrix> kModel{
    {{24, 16}, 0}, {{16, 40}, 1}, {{21, 10}, 0}, {{12, 15}, 1}, {{3, 12}, 0}};

at::Tensor full_param(size_t k) { return seeded_randn(kModel[k].shape, 40 + k); }
at::Tensor full_grad(size_t k, int64_t step) {
  return seeded_randn(kModel[k].shape, 900 + 17 * static_cast<uint64_t>(step) + k);
}

MuonOptions options() { return MuonOptions(0.02).weight_decay(0.1).scale_mode("spectral"); }

AdaptiveMuonOptions adaptive(const std::string& mode) {
  return AdaptiveMuonOptions().mode(mode).beta2(0.9);
}

// The parameters of one process after kSteps on the whole matrices.
std::vector<at::Tensor> single_process(const std::string& mode) {
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < kModel.size(); ++k) params.push_back(full_param(k).requires_grad_(true));
  AdaptiveMuon opt(params, options(), adaptive(mode));
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k) params[k].mutable_grad() = full_grad(k, s);
    opt.step();
  }
  return params;
}

// The layouts differ from one process only in the order of fp32 sums (the
// Gram matrix, the norm, the row means and the two norms of the stage summed
// over parts): a few ulps of each update, far below 1e-5 of the parameters
// after three steps, while a stage that used local statistics (a part's own
// norm or row mean) is off by a fraction of the update (~1e-3 here).
void expect_equal(const at::Tensor& got, const at::Tensor& expected, const at::Tensor& whole,
                  const std::string& what) {
  if (expected.numel() == 0) return;
  const double err =
      (got.detach() - expected).abs().max().item<double>() / whole.abs().max().item<double>();
  EXPECT_LE(err, 1e-5) << what;
}

// This rank's block of `full` along `dim` when blocks are balanced over `size` ranks.
at::Tensor block_of(const at::Tensor& full, int64_t dim, int rank, int size) {
  const auto sizes = muon::distributed::balanced_split_sizes(full.size(dim), size);
  return full.narrow(dim, muon::distributed::split_offset(sizes, rank), sizes[static_cast<size_t>(rank)])
      .contiguous();
}

// Steps `opt` kSteps times, parameter k's gradient this rank's part
// `local(k, full)` of the whole gradient, then expects each parameter to be
// the same part of one process's result `reference[k]`; `what` names the run.
void expect_steps_equal(AdaptiveMuon& opt, std::vector<at::Tensor>& params,
                        const std::function<at::Tensor(size_t, const at::Tensor&)>& local,
                        const std::vector<at::Tensor>& reference, const std::string& what) {
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k) params[k].mutable_grad() = local(k, full_grad(k, s));
    opt.step();
  }
  for (size_t k = 0; k < kModel.size(); ++k) {
    expect_equal(params[k], local(k, reference[k].detach()), reference[k],
                 what + " matrix " + std::to_string(k));
  }
}

class AdaptiveLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(AdaptiveLayouts, TensorParallelEqualsOneProcess) {
  const auto mode = GetParam();
  const auto reference = single_process(mode);
  for (const std::string tp_mode : {"duplicated", "distributed"}) {
    for (int world = 1; world <= 4; ++world) {
      muon::test::run_ranks(world, [&](Group& group) {
        std::vector<at::Tensor> params;
        muon::distributed::TensorParallelOptions tp;
        tp.mode(tp_mode);
        for (size_t k = 0; k < kModel.size(); ++k) {
          params.push_back(block_of(full_param(k), kModel[k].dim, group.rank(), world).requires_grad_(true));
          tp.shard(params.back(), muon::distributed::TensorParallelShard(kModel[k].shape, kModel[k].dim, group));
        }
        AdaptiveMuon opt({OptimizerParamGroup(params)}, options(), adaptive(mode),
                         muon::distributed::make_orthogonalizer(tp));
        expect_steps_equal(
            opt, params,
            [&](size_t k, const at::Tensor& full) {
              return block_of(full, kModel[k].dim, group.rank(), world);
            },
            reference,
            mode + " tp " + tp_mode + " world " + std::to_string(world) + " rank " +
                std::to_string(group.rank()));
      });
    }
  }
}

TEST_P(AdaptiveLayouts, RowShardsEqualOneProcess) {
  const auto mode = GetParam();
  const auto reference = single_process(mode);
  for (const std::string sharded_mode : {"owner_compute", "replicated"}) {
    for (int world = 1; world <= 4; ++world) {
      muon::test::run_ranks(world, [&](Group& group) {
        std::vector<at::Tensor> params;
        std::vector<RowShard> shards;
        std::vector<std::vector<int64_t>> rows;
        for (size_t k = 0; k < kModel.size(); ++k) {
          // Matrix 1 is padded: the last rank holds rows past the end.
          auto split = muon::distributed::balanced_split_sizes(kModel[k].shape[0], world);
          if (k == 1 && world > 1) split.back() += 2;
          rows.push_back(split);
          params.push_back(muon::distributed::local_rows(full_param(k), split, group.rank()).requires_grad_(true));
          shards.emplace_back(kModel[k].shape, group);
        }
        muon::distributed::ShardedOptions so;
        so.mode(sharded_mode);
        for (size_t k = 0; k < kModel.size(); ++k) so.shard(params[k], shards[k]);
        AdaptiveMuon opt({OptimizerParamGroup(params)}, options(), adaptive(mode),
                         muon::distributed::make_orthogonalizer(so));
        expect_steps_equal(
            opt, params,
            [&](size_t k, const at::Tensor& full) {
              return muon::distributed::local_rows(full, rows[k], group.rank());
            },
            reference,
            mode + " " + sharded_mode + " world " + std::to_string(world) + " rank " +
                std::to_string(group.rank()));
      });
    }
  }
}

TEST_P(AdaptiveLayouts, TwoDimensionalEqualsOneProcess) {
  const auto mode = GetParam();
  const auto reference = single_process(mode);
  for (const auto tp_mode :
       {muon::distributed::TensorParallelMode::kDuplicated, muon::distributed::TensorParallelMode::kDistributed}) {
    muon::test::run_ranks(4, [&](Group& world) {
      const auto [dp, tp] = world.mesh(2, 2);
      std::vector<at::Tensor> params;
      std::vector<std::vector<int64_t>> rows;
      muon::distributed::ShardedOptions so;
      for (size_t k = 0; k < kModel.size(); ++k) {
        const auto block = block_of(full_param(k), kModel[k].dim, tp.rank(), tp.size());
        rows.push_back(muon::distributed::balanced_split_sizes(block.size(0), dp.size()));
        params.push_back(muon::distributed::local_rows(block, rows[k], dp.rank()).requires_grad_(true));
        so.shard(params[k], RowShard(block.sizes().vec(), dp)
                                .tensor_parallel(muon::distributed::TensorParallelShard(
                                                     kModel[k].shape, kModel[k].dim, tp),
                                                 tp_mode));
      }
      AdaptiveMuon opt({OptimizerParamGroup(params)}, options(), adaptive(mode),
                       muon::distributed::make_orthogonalizer(so));
      expect_steps_equal(
          opt, params,
          [&, &dp = dp, &tp = tp](size_t k, const at::Tensor& full) {
            return muon::distributed::local_rows(block_of(full, kModel[k].dim, tp.rank(), tp.size()),
                                          rows[k], dp.rank());
          },
          reference,
          mode + " 2-D " + muon::distributed::to_string(tp_mode) + " rank " + std::to_string(world.rank()));
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, AdaptiveLayouts, ::testing::Values("normuon", "adamuon", "namo"));

}  // namespace
}  // namespace muon::test
