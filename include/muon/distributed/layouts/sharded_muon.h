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
///
/// Stacked experts (a parameter with ndim >= 3 in a param group with
/// `stacked_experts`, global shape (E, out, in...)): the row shard splits
/// dim 0, the experts, over the shard's group (the expert group), so every
/// rank holds whole experts (possibly none, when E is smaller than the group
/// or the split is uneven). They need no communication: in either mode each
/// rank orthogonalizes its own experts as single-process `muon::Muon` does
/// (batched by shape, each scaled from its (out, in...) shape); they have no
/// owner and join no all-to-all or all-gather. Padding experts past E get a
/// zero update, as padding rows do. Not supported inside a 2-D layout
/// (RowShard::tensor_parallel).
#include <ATen/ATen.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "muon/distributed/layouts/row_shard.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"
#include "muon/enum_names.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/muon.h"
#include "muon/optim/orthogonalizer.h"

namespace muon::distributed {

/// Who orthogonalizes the sharded matrices.
enum class ShardedMode {
  /// One owner per matrix (default).
  kOwnerCompute,
  /// Every rank gathers and orthogonalizes every matrix (redundant; for comparison).
  kReplicated,
};

/// "owner_compute" | "replicated".
MUON_ENUM_NAMES(ShardedMode, parse_sharded_mode);

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

/// The row-shard orthogonalization strategy (muon/optim/orthogonalizer.h):
/// owner-compute or replicated, batched by shape and overlapped (see the top
/// of this header). `attach` is collective over every shard's group: the
/// ranks exchange their row counts and check that they agree on each global
/// shape, each dtype, the ShardedOptions and the options of every param
/// group (lr, momentum, Newton–Schulz, ...; in a 2-D layout also over each
/// TP group); a mismatch raises c10::ValueError on every rank naming the
/// first difference (muon/distributed/runtime/agreement.h). `begin_step`,
/// `orthogonalize` and `sum_parts` are collective too; a parameter must have
/// a gradient on every rank of its group or on none. Shards may be empty (a
/// rank without rows); `Muon` hands over every parameter of a step in one
/// call, so that the batches and their collectives are the same on every rank.
class ShardedOrthogonalizer final : public Orthogonalizer {
 public:
  /// The strategy for the shards `options` declares (every parameter of
  /// the optimizer needs one).
  explicit ShardedOrthogonalizer(ShardedOptions options);

  std::string name() const override { return "sharded"; }
  void attach(const std::vector<torch::optim::OptimizerParamGroup>& groups) override;
  /// Checks that the parameters are those of `attach` and that every rank of
  /// each group steps the same ones.
  void begin_step(const std::vector<torch::optim::OptimizerParamGroup>& groups) override;
  /// split_sizes is not supported on row shards; stacked_experts is, but
  /// which parameters are experts is fixed at `attach` (turning it on or off
  /// afterwards raises).
  void check_options(const MuonOptions& options, size_t group) const override;
  /// Collective over every group of the layout (muon/optim/step_guard.h).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) const override;
  void orthogonalize(std::vector<OrthogonalizeItem>& items) override;
  void sum_parts(const OrthogonalizeItem& item, at::Tensor& partial, PartSum what) const override;

  /// One matrix's part in `owner_compute`.
  struct OwnerComputeItem {
    /// This rank's tensor of the parameter (a row shard given at attach).
    at::Tensor param;
    /// What this rank sends of it: its rows (param's rows, padding
    /// included) × any number of columns (e.g. a gradient beside the
    /// parameter's values).
    at::Tensor rows;
    /// Result: this rank's rows of the owner's result (param's rows × the
    /// matrix's columns; padding rows zero).
    at::Tensor result;
  };
  /// The whole-matrix step `owner_compute` runs at each owner: `items` (those
  /// of one batch this rank owns, in order) and their whole matrices
  /// (`wholes[k]`: the rows every rank sent, concatenated in rank order,
  /// padding rows trimmed) → one result per item, rows × cols of its whole
  /// matrix.
  using WholeMatrixStep = std::function<std::vector<at::Tensor>(const std::vector<const OwnerComputeItem*>& items,
                                                                const std::vector<at::Tensor>& wholes)>;
  /// Owner-compute with any whole-matrix step (Newton–Schulz is Muon's;
  /// muon::distributed::ShardedSoap runs SOAP's): each rank's rows of every item
  /// travel to the matrix's owner (the same owners as Muon's, one batched
  /// all-to-all per batch of the same param group, shape, dtype and columns
  /// sent, overlapped up to max_in_flight), the owner runs `step` on the
  /// whole matrices, and each rank gets its rows of the results. Collective
  /// over every shard group: every rank passes the same parameters (in any
  /// order), whole row-sharded matrices only (no tensor-parallel blocks or
  /// stacked experts); mode must be owner_compute.
  void owner_compute(std::vector<OwnerComputeItem>& items, const WholeMatrixStep& step);
  /// Whether this rank owns the matrix `param` is a row shard of (computes
  /// on it whole); raises for a parameter not given at attach.
  bool owns(const at::Tensor& param) const { return owners_.at(index_of(param)) == rank_in_group(index_of(param)); }
  /// (rows, cols) of the whole matrix `param` is a row shard of: its global
  /// shape's dim 0 × the product of the others.
  std::pair<int64_t, int64_t> whole_matrix_dims(const at::Tensor& param) const {
    const auto& l = layout_.at(index_of(param));
    return {l.rows, l.cols};
  }

  /// The owner of each parameter (flat order over the param groups): a rank
  /// of its shard's group, or -1 for stacked experts (each rank
  /// orthogonalizes its own).
  const std::vector<int64_t>& owners() const { return owners_; }
  /// Rows of parameter i held by each rank of its group, in rank order.
  const std::vector<int64_t>& rows_per_rank(size_t i) const { return layout_.at(i).rows_per_rank; }

 private:
  struct Layout {
    std::vector<int64_t> global_shape;
    int64_t rows = 0;  // M: matrix rows (dim 0)
    int64_t cols = 0;  // N: product of the other dims
    int64_t scale_rows = 0;  // the shape the scale is taken from
    int64_t scale_cols = 0;
    bool experts = false;  // stacked experts (E, out, in...): whole experts per rank, no owner
    bool tp = false;  // a tensor-parallel block (2-D layout)
    TensorParallelMode tp_mode = TensorParallelMode::kDuplicated;
    int64_t tp_dim = 0;
    Group tp_group;
    std::vector<int64_t> tp_sizes;  // every TP rank's block size along tp_dim
    int64_t matrix_rows = 0;  // rows of the matrix heads divide (the TP matrix's for a TP block)
    int64_t group_index = 0;  // into groups_
    size_t param_group = 0;   // the optimizer's param group
    std::vector<int64_t> rows_per_rank;  // local rows of every rank of the group
    std::vector<int64_t> offsets;  // first row of every rank
  };
  // One group's owner-compute exchange around a whole-matrix step
  // (src/distributed/layouts/sharded_owner_compute.cpp).
  class OwnerExchange;
  int64_t rank_in_group(size_t i) const { return groups_.at(static_cast<size_t>(layout_.at(i).group_index)).rank(); }
  // attach's parts (src/distributed/layouts/sharded_layout.cpp): parameter i's
  // layout from its shard, checked; the rows every rank of group g holds of
  // its members (indices into `params`) and their owners; in a 2-D layout,
  // the tensor-parallel ranks' block sizes and agreement.
  static Layout layout_of(size_t i, const at::Tensor& param, const RowShard& shard,
                          const torch::optim::OptimizerParamGroup& param_group, size_t param_group_index);
  void place_rows(size_t g, const std::vector<size_t>& members, const std::vector<at::Tensor>& params);
  void check_tensor_parallel(const std::vector<RowShard>& shards,
                             const std::vector<torch::optim::OptimizerParamGroup>& param_groups);
  size_t index_of(const at::Tensor& param) const;
  // The owner's orthogonalization of whole (TP block) matrices of one batch,
  // of one param group whose options are `o` (per head block with num_heads).
  std::vector<at::Tensor> orthogonalize(const std::vector<size_t>& members,
                                        const std::vector<at::Tensor>& matrices,
                                        const MuonOptions& o) const;
  // Stacked experts: each rank its own, as single-process Muon does.
  void step_experts(const std::vector<size_t>& experts, std::vector<OrthogonalizeItem*>& items) const;
  void step_owner_compute(const std::vector<size_t>& active, std::vector<OrthogonalizeItem*>& items);
  void step_replicated(const std::vector<size_t>& active, std::vector<OrthogonalizeItem*>& items);

  ShardedOptions options_;
  std::vector<Group> groups_;            // distinct groups, in first-use order
  std::vector<Layout> layout_;           // per parameter (flat order over param groups)
  std::vector<int64_t> owners_;          // per parameter
  std::vector<at::Tensor> params_;       // per parameter
  std::unordered_map<const void*, size_t> index_;  // TensorImpl → parameter
};

/// The strategy of `ShardedMuon`, for `muon::Muon`'s and
/// `muon::AdaptiveMuon`'s strategy constructors.
std::shared_ptr<ShardedOrthogonalizer> make_orthogonalizer(ShardedOptions options);

/// Muon over row-sharded parameters: a `muon::Muon` holding the
/// `ShardedOrthogonalizer` strategy; each parameter is the local shard of a
/// matrix described by its RowShard. Construction and `step()` are
/// collective (see ShardedOrthogonalizer). Options per group work as in
/// muon::Muon (batches never mix groups), except `split_sizes` (not
/// supported on row shards). With `stacked_experts`, an (E, out, in...)
/// parameter is sharded by experts over its group and each rank updates its
/// own experts without communication (see the top of this header); experts
/// may also be given as separate matrices over their expert group.
class ShardedMuon : public Muon {
 public:
  /// Over `param_groups` (groups without options get `defaults`); every
  /// parameter must have a shard in `options`.
  ShardedMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults,
              ShardedOptions options);
  /// Over one group: `params[i]` is described by `shards[i]`.
  ShardedMuon(std::vector<at::Tensor> params, std::vector<RowShard> shards,
              MuonOptions defaults = {}, ShardedOptions options = {});

  /// The owner of each parameter: a rank of its shard's group, or -1 for
  /// stacked experts (no owner).
  const std::vector<int64_t>& owners() const { return strategy_->owners(); }
  /// Rows of parameter i held by each rank of its group, in rank order.
  const std::vector<int64_t>& rows_per_rank(size_t i) const { return strategy_->rows_per_rank(i); }

 protected:
  /// "muon::distributed::ShardedMuon".
  std::string archive_kind() const override;

 private:
  ShardedMuon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults,
              std::shared_ptr<ShardedOrthogonalizer> strategy);

  std::shared_ptr<ShardedOrthogonalizer> strategy_;
};

/// A `muon::MuonFactory` that builds a `ShardedMuon` with `options`, for
/// `muon::MuonWithAdamWOptions::muon_factory`: sharded Muon for the matrices
/// and AdamW (element-wise, so it runs on the local shards as they are) for
/// the rest, one optimizer.
MuonFactory sharded_muon_factory(ShardedOptions options);

}  // namespace muon::distributed
