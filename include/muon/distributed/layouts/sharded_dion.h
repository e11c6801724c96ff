#pragma once

/// Dion (muon::Dion) over ZeRO/FSDP row-sharded parameters, by owner-compute.
///
/// Dion's power iteration, QR and column normalization span the whole
/// matrix, and its momentum and right factor Q are the whole matrix's. As
/// muon::distributed::ShardedSoap, each matrix has one owner rank (the
/// ShardedOrthogonalizer's owners: Newton–Schulz-cost packing, batched
/// all-to-all, overlap): per step every rank sends its rows of the (already
/// reduced) gradient to the owner, the owner keeps M and Q and computes the
/// update P·Qᵀ with muon::detail::dion_matrix_update, the one function every
/// layout runs, and each rank gets its rows of the update back and applies
/// them with the weight decay. Every rank counts `step`.
///
/// The owner runs the same operations on the same whole tensors as one
/// process (the same seeded draws), and the row updates are element-wise:
/// the parameters equal one process bit for bit. The bytes per step are
/// Muon's owner-compute bytes (the gradient's rows there, the update's rows
/// back). Checkpoints save the owner's M and Q once (StateSplit::kOwner) and
/// load them into whichever rank owns the matrix in the new layout. Only the
/// owner_compute mode exists; tensor-parallel blocks (the 2-D layout) and
/// 1-D parameters are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/dion.h"

namespace muon::distributed {

/// Dion over row shards by owner-compute (see the top of this header).
/// Construction and `step()` are collective over every shard's group, as
/// ShardedMuon's.
class ShardedDion : public Dion {
 public:
  /// Over `param_groups` (groups without options get `defaults`); every
  /// parameter must have a RowShard in `options` (global shape of >= 2 dims,
  /// no tensor-parallel block) and `options.mode()` must be owner_compute.
  ShardedDion(std::vector<torch::optim::OptimizerParamGroup> param_groups, DionOptions defaults,
              ShardedOptions options);
  /// Over one group: `params[i]` is described by `shards[i]`.
  ShardedDion(std::vector<at::Tensor> params, std::vector<RowShard> shards, DionOptions defaults = {},
              ShardedOptions options = {});

  /// The whole matrix `param` is a row shard of (its global shape's dim 0 × the rest).
  std::pair<int64_t, int64_t> whole_matrix_dims(const at::Tensor& param) const override;
  /// Whether this rank owns `param`'s matrix (and holds its M and Q).
  bool holds_whole_state(const at::Tensor& param) const override;
  /// Collective over every shard group (muon/optim/step_guard.h).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override;
  /// The owner of each parameter (flat order over the param groups), a rank of its shard's group.
  const std::vector<int64_t>& owners() const { return strategy_->owners(); }

 protected:
  /// Gradient rows to the owners, Dion's whole-matrix step there, update rows back.
  void step_parameters() override;

 private:
  std::shared_ptr<ShardedOrthogonalizer> strategy_;
};

}  // namespace muon::distributed
