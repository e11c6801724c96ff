// The tensor-parallel modes on one block, shared by the tensor-parallel
// strategy and the 2-D (tensor parallel inside row shards) one.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "muon/dist/layouts/tensor_parallel.h"
#include "muon/dist/runtime/group.h"
#include "muon/newton_schulz.h"
#include "muon/optim/orthogonalizer.h"

namespace muon::dist::detail {

/// This rank's block of the orthogonalized matrix that is split along `dim`
/// over `group` (`sizes`: every rank's block size along `dim`), in `mode`;
/// not scaled. Collective over `group` except in blockwise mode.
at::Tensor orthogonalize_block(const at::Tensor& block, TensorParallelMode mode, int64_t dim,
                               const Group& group, const std::vector<int64_t>& sizes,
                               const NewtonSchulzOptions& ns);

/// Orthogonalizer::sum_parts for a block split along `dim` over `group`: the
/// whole matrix sums over the group; rows sum over it when columns are
/// split; a blockwise block is a matrix of its own.
void sum_block_parts(at::Tensor& partial, PartSum what, TensorParallelMode mode, int64_t dim,
                     const Group& group);

}  // namespace muon::dist::detail
