#pragma once

/// One parameter's place in a row-sharded (ZeRO/FSDP) layout, and how to
/// make row shards: each rank of a group holds a run of dim-0 rows of the
/// logical parameter, uneven, padded or empty (muon/distributed/layouts/sharded_muon.h
/// orthogonalizes them; ShardedDataParallel makes them from full parameters).
#include <ATen/ATen.h>
#include <torch/arg.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"

namespace muon::distributed {

/// One parameter's place in a row-sharded (ZeRO/FSDP) layout.
struct RowShard {
  /// The local tensor is this rank's rows of the `global_shape` parameter,
  /// split over `group` (e.g. the data-parallel group, or an expert group).
  RowShard(std::vector<int64_t> global_shape, Group group)
      : global_shape_(std::move(global_shape)), group_(std::move(group)) {}

  /// Shape of the whole logical parameter (ndim >= 2; viewed as dim 0 × the rest).
  TORCH_ARG(std::vector<int64_t>, global_shape);
  /// The group its rows are split over.
  TORCH_ARG(Group, group);

 public:
  /// A 2-D layout (tensor parallel inside, sharded outside): the row-sharded
  /// `global_shape` matrix is this rank's tensor-parallel block of the larger
  /// matrix `tp` describes (block sizes may be uneven), orthogonalized by its
  /// owner in `mode` over `tp.group()` together with the owners of the other
  /// blocks (the same data-parallel index on every TP rank). Scaled from the
  /// whole matrix, except in blockwise mode (from the block).
  RowShard& tensor_parallel(TensorParallelShard tp, TensorParallelMode mode) {
    tp_.clear();
    tp_.push_back(std::move(tp));
    tp_mode_ = mode;
    return *this;
  }
  /// Whether the shard is a tensor-parallel block.
  bool has_tensor_parallel() const { return !tp_.empty(); }
  /// Its tensor-parallel description (has_tensor_parallel() must hold).
  const TensorParallelShard& tp() const { return tp_.front(); }
  /// Its tensor-parallel mode.
  TensorParallelMode tp_mode() const { return tp_mode_; }

 private:
  std::vector<TensorParallelShard> tp_;  // zero or one
  TensorParallelMode tp_mode_ = TensorParallelMode::kDuplicated;
};

/// The rows of `full` (a whole gradient or parameter, global shape) that rank
/// `group.rank()` holds when each rank of `group` holds `rows_per_rank[r]`
/// rows (padding rows past the end are zeros), after summing `full` over the
/// group and dividing by its size: the reduce-scatter an FSDP performs on
/// gradients, for users without one. Collective.
at::Tensor reduce_scatter_rows(const at::Tensor& full, const std::vector<int64_t>& rows_per_rank,
                               const Group& group);

/// This rank's rows of `full` for `rows_per_rank` (no communication; padding
/// rows past the end are zeros): how to shard a parameter to start with.
at::Tensor local_rows(const at::Tensor& full, const std::vector<int64_t>& rows_per_rank, int rank);

}  // namespace muon::distributed
