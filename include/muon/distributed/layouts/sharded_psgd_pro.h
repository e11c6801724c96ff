#pragma once

/// PSGD-Pro (muon::PsgdPro) over ZeRO/FSDP row-sharded parameters, by
/// owner-compute.
///
/// Its Kronecker factors span all rows and all columns, so no rank can step
/// its rows alone. As muon::distributed::ShardedMoso, each parameter has one
/// owner rank (ShardedOrthogonalizer's owners, batched all-to-all): per step
/// every rank sends its rows of the gradient (and, under l2 weight decay, of
/// the parameter) to the owner, the owner keeps the state and computes the
/// whole update with muon::detail::psgd_pro_update (its random draws seeded
/// by the matrix's shape and step, as one process draws them), and each rank
/// gets its rows of the update back and applies the weight decay and the
/// update to its rows: the parameters equal one process bit for bit.
/// Checkpoints save the owner's state once (StateSplit::kOwner). Only the
/// owner_compute mode exists; tensor-parallel blocks (the 2-D layout) and
/// 1-D parameters are refused.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <vector>

#include "muon/distributed/layouts/owner_compute.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/optim/psgd_pro.h"

namespace muon::distributed {

/// PSGD-Pro over row shards by owner-compute (see the top of this header).
/// Construction and `step()` are collective over every shard's group, as
/// ShardedMuon's.
class ShardedPsgdPro : public OwnerComputeOptimizer<PsgdPro, ShardedPsgdPro> {
 public:
  /// (param_groups, defaults, options) or (params, shards, defaults = {}, options = {}):
  /// muon::distributed::OwnerComputeOptimizer's.
  using OwnerComputeOptimizer::OwnerComputeOptimizer;
  /// What its messages name.
  static constexpr OwnerComputeNames kNames{"[muon::distributed::ShardedPsgdPro] ", "psgd_pro",
                                            "PSGD-Pro state", "preconditions whole matrices"};

 protected:
  /// Gradient rows to the owners, PSGD-Pro's step there, the update's rows back.
  void step_parameters() override;
};

}  // namespace muon::distributed
