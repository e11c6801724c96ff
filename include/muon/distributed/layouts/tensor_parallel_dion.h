#pragma once

/// Dion (muon::Dion) over tensor-parallel blocks, the low-rank factors
/// exchanged: Dion's tensor-parallel design (dion/dion.py
/// dion_update_fsdp_tp at 0a059a4, its inner shard mesh), with the
/// arithmetic of one process.
///
/// Each rank holds its block of a matrix M (rows × cols) split along dim 0 or
/// 1 over a tensor-parallel group, and its block of the momentum. B is M, or
/// Mᵀ when M is wide, as on one process (Dion orients B by the split
/// instead); a split of M's rows or columns splits B's rows or columns:
///   - B's rows split: every rank forms its rows of B·Q, the rows are
///     all-gathered and every rank orthonormalizes the same P (m' × r);
///     R = Bᵀ·P is the all-reduced sum of each rank's Bᵢᵀ·Pᵢ (n' × r);
///   - B's columns split: P = Σ Bᵢ·Qᵢ is all-reduced (m' × r) and
///     orthonormalized on every rank; R = Bᵀ·P is each rank's rows,
///     all-gathered (n' × r).
/// Every rank then has P and R whole: the zero check (one all-reduced
/// count), the error feedback and the update P·Qᵀ on its block, and
/// Q ← R with unit columns, kept whole and alike on every rank of the group
/// (drawn by each from the same seed at the first step). Per matrix and power
/// iteration each rank sends about (m' + n')·r elements, against the
/// gathered matrix (rows·cols) of Muon's duplicated mode.
///
/// The same arithmetic and seeded draws as one process, sums in another
/// order (the all-reduced products): blocks equal one process to rounding.
/// Where Dion keeps P split through a distributed orthonormalization, every
/// rank here orthonormalizes the whole P (the same draws as one process).
/// Checkpoints split M with the blocks and save Q once; they load at any
/// world size and layout. Parameters without a block step as muon::Dion.
#include <torch/optim/optimizer.h>

#include <unordered_map>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel_blocks.h"
#include "muon/optim/dion.h"

namespace muon::distributed {

/// Dion over tensor-parallel blocks (see the top of this header). `step()`
/// is collective over every block's group.
class TensorParallelDion : public TensorParallelBlocks<Dion, DionOptions> {
 public:
  /// Over `param_groups` (groups without options get `defaults`); a
  /// parameter with an entry in `shards` (by TensorImpl) is its block of that
  /// 2-D matrix, the others are whole. Raises c10::ValueError for a block
  /// that is not 2-D or whose shape does not fit its shard's.
  TensorParallelDion(std::vector<torch::optim::OptimizerParamGroup> param_groups, DionOptions defaults,
                     std::unordered_map<const void*, TensorParallelShard> shards);

 protected:
  /// Dion's step on every matrix, blocks by the exchange above.
  void step_parameters() override;
};

}  // namespace muon::distributed
