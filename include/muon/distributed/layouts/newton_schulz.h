#pragma once

/// Newton–Schulz on a matrix split over the ranks of a group, without
/// gathering it (the "distributed" tensor-parallel mode of Megatron-Core and
/// TransformerEngine).
#include <ATen/ATen.h>

#include <cstdint>

#include "muon/distributed/runtime/group.h"
#include "muon/newton_schulz.h"

namespace muon::distributed {

/// Orthogonalizes a matrix split over `group` along `partition_dim` (0: rows,
/// 1: columns) without gathering it (the distributed mode of `TensorParallelMuon`). Every rank
/// of `group` calls it with its own block (blocks may differ in size along
/// `partition_dim`, not in the other dim); each gets its block of
/// newton_schulz(whole matrix) as evaluated by the standard method. It runs
/// that method's own iteration (the same code, 16-bit policy included) with
/// ‖G‖²_F and each step's Gram matrix all-reduced over `group`; 16-bit
/// compute forms the Gram matrix in fp32 so that its partial sums are
/// summed before any rounding to 16 bits. On a one-rank group it is
/// newton_schulz with the standard method, iterating on the Gram matrix of
/// the side not split. A block may be empty along `partition_dim`
/// (a rank without rows): it still joins every all-reduce and returns an
/// empty result. Raises c10::ValueError for a block that is not a 2-D
/// floating tensor, is empty in the other dim, or a partition_dim other
/// than 0 or 1.
at::Tensor distributed_newton_schulz(const at::Tensor& block, int64_t partition_dim,
                                     const Group& group, const NewtonSchulzOptions& options = {});

}  // namespace muon::distributed
