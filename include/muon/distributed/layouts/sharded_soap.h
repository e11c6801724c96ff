#pragma once

/// SOAP (muon::Soap) over ZeRO/FSDP row-sharded parameters, by owner-compute.
///
/// SOAP preconditions each matrix with Kronecker factors of the whole
/// matrix (L = EMA of G·Gᵀ, R = EMA of Gᵀ·G) and runs Adam in their
/// eigenbases, so no rank can step its rows alone. As ShardedMuon's
/// owner-compute (muon/distributed/layouts/sharded_muon.h, the same
/// ShardedOrthogonalizer: owners by Newton–Schulz-cost packing, batched
/// all-to-all, overlap), each matrix has one owner rank: per step every rank
/// sends its rows of the (already reduced) gradient to the owner, the owner
/// keeps the whole-matrix state (exp_avg, exp_avg_sq, L, R, Q_L, Q_R) and
/// computes the whole update with muon::detail::soap_matrix_update, the one
/// function every layout runs, and each rank gets its rows of the update
/// back and applies them (decoupled and independent weight decay act on its
/// rows; under l2 the parameter's rows travel beside the gradient's, since
/// the owner's Adam sees G + wd·p). Every rank counts `step`.
///
/// With the gradient rows of one process's gradient, the owner runs the
/// same operations on the same whole tensors as one process, and the row
/// updates are element-wise: the parameters equal one process bit for bit.
///
/// Checkpoints (muon/distributed/checkpoints/checkpoint.h) save the owner's
/// whole-matrix state once (StateSplit::kOwner fields) and load it into
/// whichever rank owns the matrix in the new layout, at any world size.
/// Only the owner_compute mode exists (a replicated SOAP would keep W
/// copies of the state); tensor-parallel blocks (the 2-D layout) and
/// 1-D parameters are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/owner_compute.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/soap.h"

namespace muon::distributed {

/// SOAP over row shards by owner-compute (see the top of this header).
/// Construction and `step()` are collective over every shard's group, as
/// ShardedMuon's: the ranks agree on the shapes, dtypes, options and the
/// ShardedOptions, and raise the same c10::ValueError on every rank naming
/// the first difference.
class ShardedSoap : public OwnerComputeOptimizer<Soap, ShardedSoap> {
 public:
  /// (param_groups, defaults, options) or (params, shards, defaults = {}, options = {}):
  /// muon::distributed::OwnerComputeOptimizer's.
  using OwnerComputeOptimizer::OwnerComputeOptimizer;
  /// What its messages name.
  static constexpr OwnerComputeNames kNames{"[muon::distributed::ShardedSoap] ", "soap",
                                            "SOAP state", "preconditions whole matrices"};

  /// Never: 1-D parameters are refused at construction.
  bool is_one_d(const at::Tensor& /*param*/) const override { return false; }

 protected:
  /// Gradient rows to the owners, SOAP's whole-matrix step there, update rows back.
  void step_parameters() override;
};

}  // namespace muon::distributed
