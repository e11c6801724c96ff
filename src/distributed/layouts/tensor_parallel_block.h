// The tensor-parallel modes on one block, shared by the tensor-parallel
// strategy and the 2-D (tensor parallel inside row shards) one; the
// gathered and own blocks of the whole-matrix optimizers' tensor-parallel layouts.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"
#include "muon/newton_schulz.h"
#include "muon/optim/orthogonalizer.h"

namespace muon::distributed::detail {

/// The whole matrix of `block`, split along `dim` over `group` (uneven
/// blocks, in rank order). Collective over `group`.
at::Tensor gather_blocks(const at::Tensor& block, int64_t dim, const Group& group);

/// This rank's block of `whole`, split as `shard` says in balanced sizes.
at::Tensor own_block(const at::Tensor& whole, const TensorParallelShard& shard);

/// This rank's block of the orthogonalized matrix that is split along `dim`
/// over `group` (`sizes`: every rank's block size along `dim`), in `mode`;
/// not scaled. Collective over `group` except in blockwise mode.
at::Tensor orthogonalize_block(const at::Tensor& block, TensorParallelMode mode, int64_t dim,
                               const Group& group, const std::vector<int64_t>& sizes,
                               const NewtonSchulzOptions& ns);

/// Per-head blocks (MuonOptions::num_heads) of a matrix of `matrix_rows`
/// rows split along `dim` into blocks of `sizes`: "" when `heads` (> 1)
/// divides the rows and, for a row split, every block holds whole heads;
/// otherwise what does not fit, for an error message.
std::string head_split_problem(int64_t heads, int64_t matrix_rows, int64_t dim,
                               const std::vector<int64_t>& sizes);

/// orthogonalize_block per head block: the rows of the matrix (`matrix_rows`)
/// in `heads` equal blocks of consecutive rows, each orthogonalized alone
/// (head_split_problem must be ""). A row split keeps whole heads on each
/// rank: each rank orthogonalizes its own heads, with no communication, in
/// every mode. A column split runs the mode per head: duplicated gathers the
/// matrix once and orthogonalizes its heads as one batch, distributed runs
/// one distributed Newton–Schulz per head, blockwise the local block's heads.
at::Tensor orthogonalize_block_heads(const at::Tensor& block, TensorParallelMode mode, int64_t dim,
                                     const Group& group, const std::vector<int64_t>& sizes,
                                     const NewtonSchulzOptions& ns, int64_t heads,
                                     int64_t matrix_rows);

/// Orthogonalizer::sum_parts for a block split along `dim` over `group`: the
/// whole matrix sums over the group; rows sum over it when columns are
/// split; a blockwise block is a matrix of its own.
void sum_block_parts(at::Tensor& partial, PartSum what, TensorParallelMode mode, int64_t dim,
                     const Group& group);

}  // namespace muon::distributed::detail
