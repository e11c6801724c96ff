#pragma once

/// Dion2 and NorDion2 (muon::Dion2) over ZeRO/FSDP row-sharded parameters,
/// by owner-compute.
///
/// Dion2 selects the top fraction of a matrix's rows (or columns) by their
/// L1 norms over the whole momentum, so the selection needs every row. As
/// ShardedSoap (muon/dist/layouts/sharded_soap.h), through the same
/// ShardedOrthogonalizer exchange: each matrix has one owner rank; per step
/// every rank sends its rows of the (already reduced) gradient to the owner,
/// the owner keeps the whole state (momentum, and NorDion2's variance) and
/// runs muon::detail::dion2_update on the whole parameter, the one function
/// every layout runs, and each rank gets its rows of the update back
/// (zero outside the selected slices) and applies weight decay and the
/// update to its rows. Every rank counts `step`.
///
/// With the gradient rows of one process's gradient, the owner runs the
/// same operations on the same whole tensors as one process, and the row
/// updates are element-wise: the parameters equal one process bit for bit.
/// The bytes sent per step are Muon's owner-compute bytes (the gradient's
/// rows to the owner, the update's rows back).
///
/// Checkpoints save the owner's whole state once (StateSplit::kOwner) and
/// load it into whichever rank owns the matrix in the new layout, at any
/// world size. Only the owner_compute mode exists; tensor-parallel blocks
/// (the 2-D layout) are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "muon/dist/layouts/sharded_muon.h"
#include "muon/optim/dion2.h"

namespace muon::dist {

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
  /// Whether this rank owns `param`'s matrix (and holds its state).
  bool holds_whole_state(const at::Tensor& param) const override;
  /// Collective over every shard group (muon/optim/step_guard.h).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override;

  /// The owner of each parameter (flat order over the param groups), a rank of its shard's group.
  const std::vector<int64_t>& owners() const { return strategy_->owners(); }

 protected:
  /// Gradient rows to the owners, Dion2's whole-parameter step there, update rows back.
  void step_parameters() override;

 private:
  std::shared_ptr<ShardedOrthogonalizer> strategy_;
  std::unordered_map<const void*, std::vector<int64_t>> global_shapes_;
};

}  // namespace muon::dist
