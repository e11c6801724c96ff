#pragma once

/// The KL-SOAP family (muon::KlSoap: kl_soap, kl_m_soap, rekls, rekls_v3,
/// tp_rekls) over tensor-parallel blocks: Emerging-Optimizers' TpRekls
/// (emerging_optimizers/legacy_soap/tp_rekls.py at fd77292) for every kind.
///
/// Each rank holds its block of a matrix split along dim 0 or 1 over a
/// tensor-parallel group. A step all-gathers the blocks of the gradient
/// (beside them, under rekls' l2 weight decay, of the parameter) into the
/// whole matrix on every rank of the group, runs the family's whole-matrix
/// step (muon::detail::kl_soap_update, the one function every layout runs)
/// with whole-matrix state that every rank of the group keeps alike, and
/// applies its own block of the update and the weight decay to its block.
/// Parameters without a block (replicated) step as muon::KlSoap does.
///
/// Every rank computes on the very tensors one process has: the blocks equal
/// one process's bit for bit. The state is whole on every rank of the group
/// (Emerging-Optimizers keeps L and R split by rows to save memory; here they
/// are whole, so that a checkpoint holds one copy that reshards to every
/// layout), and a checkpoint stores it once.
#include <torch/optim/optimizer.h>

#include <unordered_map>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel_blocks.h"
#include "muon/optim/kl_soap.h"

namespace muon::distributed {

/// The KL-SOAP family over tensor-parallel blocks (see the top of this header).
/// `step()` is collective over every block's group.
class TensorParallelKlSoap : public TensorParallelBlocks<KlSoap, KlSoapOptions> {
 public:
  /// Over `param_groups` (groups without options get `defaults`); a
  /// parameter with an entry in `shards` (by TensorImpl) is its block of that
  /// 2-D matrix, the others are whole. Raises c10::ValueError for a block
  /// that is not 2-D or whose shape does not fit its shard's.
  TensorParallelKlSoap(std::vector<torch::optim::OptimizerParamGroup> param_groups, KlSoapOptions defaults,
                       std::unordered_map<const void*, TensorParallelShard> shards);

 protected:
  /// Gathers, steps the whole matrix, keeps the block (see the top of this header).
  void step_parameters() override;
};

}  // namespace muon::distributed
