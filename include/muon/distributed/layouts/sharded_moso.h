#pragma once

/// MOSO (muon::Moso) over ZeRO/FSDP row-sharded parameters, by owner-compute.
///
/// MOSO's covariance spans the whole matrix's smaller side and its
/// eigenbasis comes from eigh and QR of the whole covariance, so no rank can
/// step its rows alone. As muon::distributed::ShardedSoap, each matrix has
/// one owner rank (ShardedOrthogonalizer's owners, batched all-to-all): per
/// step every rank sends its rows of the gradient to the owner, the owner
/// keeps the momentum, the second moment, M and Q_M and computes the whole
/// update with muon::detail::moso_matrix_update, the one function every
/// layout runs, and each rank gets its rows of the update back and applies
/// the weight decay and the update to its rows. Every rank counts `step`.
///
/// The owner runs the same operations on the same whole tensors as one
/// process, and each rank the same element-wise operations on its rows: the
/// parameters equal one process bit for bit. Checkpoints save the owner's
/// state once (StateSplit::kOwner) and load it into whichever rank owns the
/// matrix in the new layout. Only the owner_compute mode exists; tensor-
/// parallel blocks (the 2-D layout) and 1-D parameters are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/owner_compute.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/moso.h"

namespace muon::distributed {

/// MOSO over row shards by owner-compute (see the top of this header).
/// Construction and `step()` are collective over every shard's group, as
/// ShardedMuon's.
class ShardedMoso : public OwnerComputeOptimizer<Moso, ShardedMoso> {
 public:
  /// (param_groups, defaults, options) or (params, shards, defaults = {}, options = {}):
  /// muon::distributed::OwnerComputeOptimizer's.
  using OwnerComputeOptimizer::OwnerComputeOptimizer;
  /// What its messages name.
  static constexpr OwnerComputeNames kNames{"[muon::distributed::ShardedMoso] ", "moso",
                                            "MOSO state", "preconditions whole matrices"};

 protected:
  /// Gradient rows to the owners, MOSO's step there, the update's rows back.
  void step_parameters() override;
};

}  // namespace muon::distributed
