#pragma once

/// The KL-SOAP family (muon::KlSoap: kl_soap, kl_m_soap, rekls, rekls_v3,
/// stacked_soap) over ZeRO/FSDP row-sharded parameters, by owner-compute.
///
/// The Kronecker factors span all rows and all columns and their eigenbases
/// come from eigh and QR of the whole factors, so no rank can step its rows
/// alone. As muon::distributed::ShardedSoap, each parameter has one owner
/// rank (ShardedOrthogonalizer's owners, batched all-to-all): per step every
/// rank sends its rows of the gradient (and, under rekls' l2 weight decay,
/// of the parameter) to the owner, the owner keeps the state and computes
/// the whole update with muon::detail::kl_soap_update, the one function
/// every layout runs, and each rank gets its rows of the update back and
/// applies the weight decay and the update to its rows. Every rank counts
/// `step`. A stacked_soap 3-D stack is sharded along its dim 0 (the experts).
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
#include "muon/optim/kl_soap.h"

namespace muon::distributed {

/// The KL-SOAP family over row shards by owner-compute (see the top of this header).
/// Construction and `step()` are collective over every shard's group, as
/// ShardedMuon's.
class ShardedKlSoap : public OwnerComputeOptimizer<KlSoap, ShardedKlSoap> {
 public:
  /// (param_groups, defaults, options) or (params, shards, defaults = {}, options = {}):
  /// muon::distributed::OwnerComputeOptimizer's.
  using OwnerComputeOptimizer::OwnerComputeOptimizer;
  /// What its messages name.
  static constexpr OwnerComputeNames kNames{"[muon::distributed::ShardedKlSoap] ", "kl_soap",
                                            "KL-SOAP state", "preconditions whole matrices"};
  /// The registry name in messages: the family member the defaults' `kind` names.
  static const char* optimizer_name(const KlSoapOptions& defaults) { return defaults.kind().c_str(); }

 protected:
  /// Gradient rows to the owners, the family's step there, the update's rows back.
  void step_parameters() override;
};

}  // namespace muon::distributed
