#pragma once

/// How a parameter is split across the ranks of a tensor-parallel group.
///
/// A TP-sharded weight is one logical matrix of `global_shape`, cut along
/// `partition_dim` into consecutive blocks, one per rank of `group` in rank
/// order: dim 0 for column-parallel linear layers (QKV, fc1: output features
/// split), dim 1 for row-parallel ones (attention proj, fc2: input features
/// split). Blocks may have different sizes (uneven shards); each rank knows
/// only its own, the optimizer exchanges them at construction.
#include <torch/arg.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "muon/distributed/runtime/group.h"

namespace muon::distributed {

/// One parameter's place in a tensor-parallel layout, given explicitly: there
/// is no default group.
struct TensorParallelShard {
  /// A shard of the `global_shape` matrix split along `partition_dim` over `group`.
  TensorParallelShard(std::vector<int64_t> global_shape, int64_t partition_dim, Group group)
      : global_shape_(std::move(global_shape)),
        partition_dim_(partition_dim),
        group_(std::move(group)) {}

  /// Shape of the whole logical matrix (2-D: rows = dim 0 = output features).
  TORCH_ARG(std::vector<int64_t>, global_shape);
  /// The dimension that is split: 0 (rows) or 1 (columns).
  TORCH_ARG(int64_t, partition_dim);
  /// The tensor-parallel group the matrix is split over.
  TORCH_ARG(Group, group);
};

/// Balanced split sizes of `total` into `parts` blocks (the first
/// total % parts blocks one larger), as Megatron divides uneven dimensions.
/// Raises c10::ValueError for total < 0 or parts < 1.
std::vector<int64_t> balanced_split_sizes(int64_t total, int64_t parts);

/// Offset of block `index` when blocks have `sizes`.
int64_t split_offset(const std::vector<int64_t>& sizes, int64_t index);

}  // namespace muon::distributed
