#pragma once

/// Muon over ZeRO/FSDP row-sharded parameters, with owner-compute
/// orthogonalization.
///
/// Each rank holds a row shard (dim 0) of every logical matrix: the local
/// tensors of the ranks of the parameter's group, concatenated in rank order,
/// hold the matrix's rows followed by padding rows (flat-buffer style; the
/// global shape trims them). Shards may be uneven, padded or empty. Gradient
/// shards come in already reduce-scattered (an FSDP does that;
/// `reduce_scatter_rows` below does it for full local gradients).
///
/// Weight decay and momentum are element-wise and run on the local shard.
/// Newton–Schulz needs the whole matrix, so each matrix has one owner rank
/// (longest-processing-time packing on max(M,N)·min(M,N)², assignment.h).
/// Per step, matrices of the same shape and param group form a batch: one
/// all-to-all brings every shard of the batch to its owners, each owner runs
/// one batched Newton–Schulz on the whole matrices it owns, and one
/// all-to-all returns the rows of each shard. While one batch is
/// orthogonalized, the next batches' shards are already travelling (at most
/// `max_in_flight` batches ahead). No rank orthogonalizes a slice, and no
/// matrix is orthogonalized twice.
///
/// `kReplicated` mode instead all-gathers every matrix on every rank and
/// orthogonalizes all of them everywhere (as Moonlight and Megatron-FSDP
/// do): the same result with W times the compute, kept for comparison.
#include <ATen/ATen.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/distributed/group.h"
#include "muon/distributed/shard.h"
#include "muon/distributed/tensor_parallel.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/muon.h"

namespace muon::dist {

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

/// Who orthogonalizes the sharded matrices.
enum class ShardedMode {
  /// One owner per matrix (default).
  kOwnerCompute,
  /// Every rank gathers and orthogonalizes every matrix (redundant; for comparison).
  kReplicated,
};

/// "owner_compute" | "replicated".
std::string to_string(ShardedMode mode);
/// Inverse of to_string; unknown names raise c10::ValueError listing the valid ones.
ShardedMode parse_sharded_mode(const std::string& name);

/// Options of `ShardedMuon` beyond MuonOptions: the mode, the overlap and
/// the shard of every parameter.
struct ShardedOptions {
  /// Owner-compute (default) or replicated.
  TORCH_ARG(ShardedMode, mode) = ShardedMode::kOwnerCompute;
  /// Batches whose shards travel while the current one is orthogonalized (>= 0).
  TORCH_ARG(int64_t, max_in_flight) = 2;

 public:
  /// mode by name: "owner_compute" | "replicated".
  ShardedOptions& mode(const std::string& name);
  /// Declares `param` (this rank's rows) a shard described by `shard`.
  ShardedOptions& shard(const at::Tensor& param, RowShard shard);
  /// The declared shards, in the order given.
  const std::vector<std::pair<at::Tensor, RowShard>>& shards() const { return shards_; }

 private:
  std::vector<std::pair<at::Tensor, RowShard>> shards_;
};

/// Muon over row-sharded parameters: each parameter is the local shard of
/// a matrix described by its RowShard. Construction is collective over every
/// shard's group: the ranks exchange their row counts and check that they
/// agree on each global shape (a mismatch raises c10::ValueError on every
/// rank). `step()` is collective too; a parameter must have a gradient on
/// every rank of its group or on none. Options per group work as in
/// muon::Muon (batches never mix groups), except `split_sizes` and
/// `stacked_experts` (not supported on row shards: give experts as separate
/// matrices over their expert group).
class ShardedMuon : public Muon {
 public:
  /// Over `param_groups` (groups without options get `defaults`); every
  /// parameter must have a shard in `options`.
  ShardedMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults,
              ShardedOptions options);
  /// Over one group: `params[i]` is described by `shards[i]`.
  ShardedMuon(std::vector<at::Tensor> params, std::vector<RowShard> shards,
              MuonOptions defaults = {}, ShardedOptions options = {});

  /// One step: local momentum, orthogonalization of the whole matrices by
  /// their owners (or everywhere, in replicated mode), local update.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// The owner of each parameter: a rank of its shard's group.
  const std::vector<int64_t>& owners() const { return owners_; }
  /// Rows of parameter i held by each rank of its group, in rank order.
  const std::vector<int64_t>& rows_per_rank(size_t i) const { return layout_[i].rows_per_rank; }

 protected:
  std::string archive_kind() const override;

 private:
  struct Layout {
    std::vector<int64_t> global_shape;
    int64_t rows = 0;  // M: matrix rows (dim 0)
    int64_t cols = 0;  // N: product of the other dims
    int64_t scale_rows = 0;  // the shape the scale is taken from
    int64_t scale_cols = 0;
    bool tp = false;  // a tensor-parallel block (2-D layout)
    TensorParallelMode tp_mode = TensorParallelMode::kDuplicated;
    int64_t tp_dim = 0;
    Group tp_group;
    std::vector<int64_t> tp_sizes;  // every TP rank's block size along tp_dim
    int64_t group_index = 0;  // into groups_
    std::vector<int64_t> rows_per_rank;  // local rows of every rank of the group
    std::vector<int64_t> offsets;  // first row of every rank
  };
  // The owner's orthogonalization of whole (TP block) matrices of one batch.
  std::vector<at::Tensor> orthogonalize(const std::vector<size_t>& members,
                                        const std::vector<at::Tensor>& matrices) const;
  void step_owner_compute(const std::vector<size_t>& active, const std::vector<at::Tensor>& updates);
  void step_replicated(const std::vector<size_t>& active, const std::vector<at::Tensor>& updates);

  ShardedOptions options_;
  std::vector<Group> groups_;            // distinct groups, in first-use order
  std::vector<Layout> layout_;           // per parameter (flat order over param groups)
  std::vector<int64_t> owners_;          // per parameter
  std::vector<std::pair<size_t, size_t>> index_;  // per parameter: (param group, index in it)

  at::Tensor& param(size_t i) { return param_groups_[index_[i].first].params()[index_[i].second]; }
  const MuonOptions& options_of(size_t i) const {
    return static_cast<const MuonOptions&>(param_groups_[index_[i].first].options());
  }
};

/// A `muon::MuonFactory` that builds a `ShardedMuon` with `options`, for
/// `muon::MuonWithAdamWOptions::muon_factory`: sharded Muon for the matrices
/// and AdamW (element-wise, so it runs on the local shards as they are) for
/// the rest, one optimizer.
MuonFactory sharded_muon_factory(ShardedOptions options);

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

}  // namespace muon::dist
