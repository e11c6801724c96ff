#pragma once

/// Iso (muon::Iso) over ZeRO/FSDP row-sharded parameters, by owner-compute.
///
/// Iso keeps each matrix as U·diag(σ)·Vᵀ and retracts the whole Stiefel
/// factors (QR, SVD or a solve of the whole factor), so no rank can step
/// its rows alone. As muon::distributed::ShardedSoap, each matrix has one
/// owner rank (ShardedOrthogonalizer's owners, batched all-to-all): per step
/// every rank sends its rows of the gradient (and, at the first step, of
/// the parameter, which the SVD factorizes) to the owner, the owner keeps
/// U, σ, V and the momenta and computes the new whole matrix with
/// muon::detail::iso_matrix_update, the one function every layout runs, and
/// each rank gets its rows of it back. Every rank counts `step`.
///
/// The owner runs the same operations on the same whole tensors as one
/// process: the parameters equal one process bit for bit. Checkpoints save
/// the owner's state once (StateSplit::kOwner) and load it into whichever
/// rank owns the matrix in the new layout. Only the owner_compute mode
/// exists; tensor-parallel blocks (the 2-D layout) and 1-D parameters are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/owner_compute.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/iso.h"

namespace muon::distributed {

/// Iso over row shards by owner-compute (see the top of this header).
/// Construction and `step()` are collective over every shard's group, as
/// ShardedMuon's.
class ShardedIso : public OwnerComputeOptimizer<Iso, ShardedIso> {
 public:
  /// (param_groups, defaults, options) or (params, shards, defaults = {}, options = {}):
  /// muon::distributed::OwnerComputeOptimizer's.
  using OwnerComputeOptimizer::OwnerComputeOptimizer;
  /// What its messages name.
  static constexpr OwnerComputeNames kNames{"[muon::distributed::ShardedIso] ", "iso", "Iso state",
                                            "factorizes whole matrices"};

 protected:
  /// Gradient (and first-step parameter) rows to the owners, Iso's step there, new rows back.
  void step_parameters() override;
};

}  // namespace muon::distributed
