#pragma once

/// Dion2 and NorDion2 (muon::Dion2) over ZeRO/FSDP row-sharded parameters:
/// each rank keeps its rows of the momentum (and of NorDion2's variance),
/// and only the selected slices travel.
///
/// Per matrix and step (one owner per matrix, the owners of ShardedMuon's
/// owner-compute: muon/distributed/layouts/sharded_muon.h's ShardedOrthogonalizer):
///
///   1. every rank: M ← M + G on its rows; the matrix's largest |M| (an
///      all-gather of one number per rank)
///   2. rows selected (rows <= cols, or NorDion2): each rank's fixed-point
///      row norms are all-gathered (rows int64 in all); columns selected:
///      each rank's exact partial column sums are all-gathered and added
///      (cols int64 per rank). Every rank computes the same top-k.
///   3. every rank decays its part of the selected slices (error feedback)
///      and sends it to the owner: its selected rows (with their variance),
///      or its rows of the selected columns
///   4. the owner runs muon::detail::dion2_orthogonalize, the function one
///      process runs, on the k × cols (or rows × k) submatrix, and sends
///      each rank its part of O back
///   5. every rank: weight decay and X − adjusted_lr·U on its rows.
///
/// Stacked matrices (3+ dims without flatten) are split whole between the
/// ranks (dim 0 is their batch): each rank steps its own matrices as one
/// process does, with no communication.
///
/// Equal to one process bit for bit: the norms are exact integer sums
/// (muon::detail::dion2_fixed_point_norms), so the selection is the same;
/// the submatrix the owner assembles is the one process's, bit for bit; the
/// rest is element-wise on each rank's rows. Per step and matrix the bytes
/// sent are the selected slices twice (the fraction of Muon's owner-compute
/// traffic) plus the norms (tests/test_dion2.cpp measures them).
///
/// Checkpoints split the state with the rows (StateSplit::kWithRows) and
/// reshard to any layout and world size. Only the owner_compute mode exists;
/// tensor-parallel blocks (the 2-D layout) are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/dion2.h"

namespace muon::distributed {

/// Dion2 (or NorDion2) over row shards by owner-compute (see the top of
/// this header). Construction and `step()` are collective over every
/// shard's group, as ShardedMuon's.
class ShardedDion2 : public Dion2 {
 public:
  /// Over `param_groups` (groups without options get `defaults`); every
  /// parameter must have a RowShard in `options` (global shape of >= 2 dims,
  /// no tensor-parallel block) and `options.mode()` must be owner_compute.
  ShardedDion2(std::vector<torch::optim::OptimizerParamGroup> param_groups, Dion2Options defaults,
               ShardedOptions options);
  /// Over one group: `params[i]` is described by `shards[i]`.
  ShardedDion2(std::vector<at::Tensor> params, std::vector<RowShard> shards,
               Dion2Options defaults = {}, ShardedOptions options = {});

  /// The global shape of the parameter `param` is a row shard of.
  std::vector<int64_t> whole_shape(const at::Tensor& param) const override;
  /// Collective over every shard group (muon/optim/step_guard.h).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override;

  /// The owner of each parameter (flat order over the param groups), a rank of its shard's group.
  const std::vector<int64_t>& owners() const { return strategy_->owners(); }

 protected:
  /// Steps every parameter with a gradient (see the top of this header).
  void step_parameters() override;

 private:
  /// Steps 1–4 of the top of this header for parameter `index` (flat order
  /// over the groups); returns this rank's rows of U.
  at::Tensor step_split_matrix(const at::Tensor& p, Dion2ParamState& st, const Dion2Options& o,
                               size_t index);

  std::shared_ptr<ShardedOrthogonalizer> strategy_;
  std::unordered_map<const void*, std::vector<int64_t>> global_shapes_;
  std::unordered_map<const void*, Group> groups_;
};

}  // namespace muon::distributed
