// AdaptiveMuon (NorMuon per row, AdaMuon per element, NAMO per matrix) in every distributed
// layout: its second-moment stage runs on each rank's part of a matrix and
// sums row statistics and norms over the other parts through the layout's
// strategy, so tensor-parallel blocks (row- or column-split, uneven, empty),
// row shards (owner-compute and replicated, uneven, padded, empty) and the
// 2-D layout all give the parameters of one process on the whole matrices.
// Ranks are threads over real Gloo groups, world sizes 1–4.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "layout_harness.h"
#include "muon/optim/adaptive_muon.h"

namespace muon::test {
namespace {

using torch::optim::OptimizerParamGroup;

MuonOptions options() { return MuonOptions(0.02).weight_decay(0.1).scale_mode("spectral"); }

AdaptiveMuonOptions adaptive(const std::string& mode) {
  return AdaptiveMuonOptions().mode(mode).beta2(0.9);
}

// AdaptiveMuon in `mode` over the harness's matrices (layout_harness.h).
layouts::Factory adaptive_muon(const std::string& mode) {
  return [mode](const std::vector<at::Tensor>& params,
                std::shared_ptr<Orthogonalizer> o) -> std::unique_ptr<torch::optim::Optimizer> {
    if (!o) return std::make_unique<AdaptiveMuon>(params, options(), adaptive(mode));
    return std::make_unique<AdaptiveMuon>(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, options(),
                                          adaptive(mode), o);
  };
}

// The layouts differ from one process only in the order of fp32 sums (the
// Gram matrix, the norm, the row means and the two norms of the stage summed
// over parts): a few ulps of each update, far below 1e-5 of the parameters
// after three steps, while a stage that used local statistics (a part's own
// norm or row mean) is off by a fraction of the update (~1e-3 here).
constexpr double kTolerance = 1e-5;

class AdaptiveLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(AdaptiveLayouts, TensorParallelEqualsOneProcess) {
  const auto mode = GetParam();
  const auto reference = layouts::single_process(adaptive_muon(mode));
  layouts::expect_tensor_parallel_equal(adaptive_muon(mode), reference, kTolerance, mode);
}

TEST_P(AdaptiveLayouts, RowShardsEqualOneProcess) {
  const auto mode = GetParam();
  const auto reference = layouts::single_process(adaptive_muon(mode));
  layouts::expect_row_shards_equal(adaptive_muon(mode), reference, kTolerance, mode);
}

TEST_P(AdaptiveLayouts, TwoDimensionalEqualsOneProcess) {
  const auto mode = GetParam();
  const auto reference = layouts::single_process(adaptive_muon(mode));
  layouts::expect_two_dimensional_equal(
      adaptive_muon(mode), reference, kTolerance, mode,
      {muon::distributed::TensorParallelMode::kDuplicated, muon::distributed::TensorParallelMode::kDistributed});
}

INSTANTIATE_TEST_SUITE_P(Modes, AdaptiveLayouts, ::testing::Values("normuon", "adamuon", "namo"));

}  // namespace
}  // namespace muon::test
