#pragma once

/// Megatron-style tensor-parallel (TP) linear layers as LibTorch modules over
/// a `muon::distributed::Group`, and the map of their shards that the optimizer and
/// the checkpoints take.
///
///     auto [dp, tp] = world.mesh(world.size() / 2, 2);
///     muon::distributed::ColumnParallelLinear fc1(512, 2048, tp);   // output features split
///     muon::distributed::RowParallelLinear fc2(2048, 512, tp);      // input features split
///     auto y = fc2(at::gelu(fc1(x)));                        // x, y whole on every TP rank
///
///     muon::distributed::DistributedLayout layout;
///     layout.tensor_parallel = muon::distributed::tensor_parallel_shards(*model);
///     auto opt = muon::distributed::make_optimizer(model->named_parameters(), config, layout);
///
/// A column-parallel layer holds rows [offset, offset + rows_r) of the whole
/// (out, in) weight: it takes the whole input and gives this rank's slice of
/// the output features. A row-parallel layer holds columns of the whole
/// weight: it takes this rank's slice of the input features (the
/// column-parallel layer's output) and gives the whole output, summed over
/// the ranks. Column → elementwise → row is Megatron's MLP and attention
/// block: one all-reduce in the forward, one in the backward.
///
/// Collective rule (muon/distributed/runtime/group.h): the forward of a
/// RowParallelLinear and the backward of a ColumnParallelLinear are
/// collective over the layer's TP group (every rank runs the same layers in
/// the same order); nothing communicates when tp.size() == 1, and then both
/// layers compute exactly what torch::nn::Linear computes.
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"

namespace muon::distributed {

/// Megatron's "f": identity in the forward (returns `x` itself, as a new
/// autograd node); the backward sums the gradient over `tp` (an all-reduce,
/// collective over `tp`). Put in front of a column-parallel product, so that
/// the input, used by every rank's block, gets the whole gradient. With
/// tp.size() == 1, when grad mode is off or `x` does not require grad it
/// returns `x` (no node, no communication). First-order only (the backward
/// is not itself differentiable). Raises c10::ValueError for an undefined
/// `x` or an invalid `tp`.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const Group& tp);

/// Megatron's "g": the sum of `x` over `tp` (a new tensor; an all-reduce,
/// collective over `tp`); the backward passes the gradient through
/// unchanged. Put after a row-parallel product to add the ranks' partial
/// sums. With tp.size() == 1 it returns `x` (no communication). Raises
/// c10::ValueError for an undefined `x` or an invalid `tp`.
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const Group& tp);

/// A module that holds tensor-parallel blocks and says which of its own
/// parameters are shards of which whole matrix. `tensor_parallel_shards`
/// collects them over a model.
class TensorParallelModule {
 public:
  virtual ~TensorParallelModule();
  /// (name of one of this module's own parameters, e.g. "weight" or "bias";
  /// its shard: global shape, partition dim, group), for each parameter
  /// that is a TP block. Replicated parameters are not listed.
  virtual std::vector<std::pair<std::string, TensorParallelShard>> tensor_parallel_shards() const = 0;
};

/// The shards of every TensorParallelModule in `root` (itself included), by
/// full parameter name as `root.named_parameters()` spells them
/// ("blocks.0.mlp.fc1.weight"): what `DistributedLayout::tensor_parallel`
/// (muon/distributed/layouts/make.h) and the checkpoints (muon/distributed/checkpoints/checkpoint.h)
/// take. 1-D shards (a column-parallel bias, partition dim 0) are included.
/// Not collective. `root` need not be held by a shared_ptr. Raises
/// c10::ValueError when a module declares a name that is not one of its own
/// parameters (naming the module and the name).
std::map<std::string, TensorParallelShard> tensor_parallel_shards(const torch::nn::Module& root);

/// Rows (or columns) per rank of a projection split by whole heads: `heads`
/// heads of `rows_per_head` rows each, balanced over `tp_size` ranks (the
/// first heads % tp_size ranks one head more), each rank's count times
/// `rows_per_head`. With fewer heads than ranks the last ranks hold no head
/// (empty blocks: the layers, TensorParallelMuon and the checkpoints accept
/// them; the ranks still join every collective). For a fused QKV projection
/// pass rows_per_head = 3·head_dim; for the attention output projection
/// (a row-parallel layer's cols_per_rank) head_dim. Raises c10::ValueError
/// for heads < 1, rows_per_head < 1 or tp_size < 1, naming the argument.
std::vector<int64_t> rows_per_rank_by_heads(int64_t heads, int64_t rows_per_head, int64_t tp_size);

/// What ColumnParallelLinear and RowParallelLinear share: a linear layer
/// y = x·Wᵀ + b over the whole (out_features, in_features) weight W, of
/// which this rank holds one block along the split dimension (0: rows, the
/// output features; 1: columns, the input features), and the bias, split
/// with the rows or, when the columns are split, replicated. Constructed only
/// as one of the two layers.
class ParallelLinearBase : public torch::nn::Module, public TensorParallelModule {
 public:
  /// Copies this rank's block of a whole (out_features, in_features)
  /// `weight` and, when given, of a whole (out_features) `bias` (its rows
  /// when the rows are split, else the whole bias) into the parameters
  /// (without recording gradients; any dtype and device, converted). An
  /// undefined `bias` leaves the bias as it is. Not collective. Raises
  /// c10::ValueError for a wrong shape, or a `bias` given to a layer without
  /// one.
  void load_full(const at::Tensor& weight, const at::Tensor& bias = {});

  /// "weight" (along the split dimension) and, when it is split with the
  /// rows and present, "bias" (dim 0), over `group()`; a replicated bias is
  /// not a shard.
  std::vector<std::pair<std::string, TensorParallelShard>> tensor_parallel_shards() const override;

  /// "muon::distributed::ColumnParallelLinear(in_features=…, out_features=…,
  /// rows_per_rank=…, …)", or RowParallelLinear with cols_per_rank.
  void pretty_print(std::ostream& stream) const override;

  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  /// First row (or column) of this rank's block in the whole weight.
  int64_t offset() const { return offset_; }
  /// The TP group the features are split over.
  const Group& group() const { return tp_; }

  /// This rank's block of the weight: (rows_r, in_features) or
  /// (out_features, cols_r).
  at::Tensor weight;
  /// This rank's block of the bias, (rows_r), or the whole bias,
  /// (out_features), replicated; undefined without bias.
  at::Tensor bias;

 protected:
  /// Checks the arguments (see the two layers), splits dimension
  /// `split_dim` into `sizes_per_rank` (balanced when empty) and draws the
  /// whole weight and bias as torch::nn::Linear(in_features, out_features)
  /// does, keeping this rank's block. Not collective.
  ParallelLinearBase(int64_t in_features, int64_t out_features, Group tp, bool bias,
                     std::vector<int64_t> sizes_per_rank, int64_t split_dim);

  int64_t in_features_;
  int64_t out_features_;
  Group tp_;
  int64_t split_dim_;
  /// Rows (or columns) of every rank's block, in rank order.
  std::vector<int64_t> sizes_per_rank_;
  int64_t offset_;
};

/// A linear layer y = x·Wᵀ + b whose output features are split over `tp`:
/// this rank holds rows [offset(), offset() + rows) of the whole
/// (out_features, in_features) weight W and of the bias, and computes those
/// output features from the whole input.
///
/// Parameters: "weight" (rows_r, in_features) and, with `bias`, "bias"
/// (rows_r); both TP shards along dim 0 (declared by
/// `tensor_parallel_shards`). forward(x): x (…, in_features), whole and the
/// same on every rank → (…, rows_r); its backward all-reduces the gradient of
/// x over `tp` (collective), so every rank gets the whole input gradient.
///
/// Initialization: the whole weight and bias are drawn as torch::nn::Linear
/// draws them (kaiming_uniform_(a = √5), bias uniform(±1/√in_features)), from
/// the global generator, and this rank keeps its rows: with the same seed on
/// every rank the blocks tile the matrix a torch::nn::Linear(in, out) would
/// get (Megatron's CPU initialization; the whole matrix is allocated once,
/// during construction). Or copy from a whole weight with `load_full`.
///
/// Fused QKV split per head: with out_features = 3·d (d = heads·head_dim)
/// and the rows ordered per head (head h: its head_dim q rows, then its k
/// rows, then its v rows), pass rows_per_rank =
/// rows_per_rank_by_heads(heads, 3·head_dim, tp.size()): every rank holds
/// whole heads, its output (…, heads_r·3·head_dim) views as
/// (…, heads_r, 3, head_dim), attention runs on the local heads alone, and a
/// RowParallelLinear(d, d, tp, bias, rows_per_rank_by_heads(heads, head_dim,
/// tp.size())) projects the concatenated heads back.
///
/// Raises c10::ValueError, naming the argument and its value, for
/// in_features < 1, out_features < 1, an invalid `tp`, or rows_per_rank
/// without one entry ≥ 0 per rank summing to out_features.
class ColumnParallelLinearImpl : public ParallelLinearBase {
 public:
  /// `rows_per_rank`: rows of every rank's block, in rank order; empty means
  /// balanced_split_sizes(out_features, tp.size()). Not collective.
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, Group tp, bool bias = true,
                           std::vector<int64_t> rows_per_rank = {});

  /// linear(copy_to_tensor_parallel(x, tp), weight, bias): this rank's output
  /// features. Its backward is collective over `tp`.
  at::Tensor forward(const at::Tensor& x);

  /// Rows of every rank's block, in rank order.
  const std::vector<int64_t>& rows_per_rank() const { return sizes_per_rank_; }
};
TORCH_MODULE(ColumnParallelLinear);

/// A linear layer y = x·Wᵀ + b whose input features are split over `tp`:
/// this rank holds columns [offset(), offset() + cols) of the whole
/// (out_features, in_features) weight and multiplies them with its slice of
/// the input; the partial products are summed over the ranks, then the
/// (replicated) bias is added once.
///
/// Parameters: "weight" (out_features, cols_r), a TP shard along dim 1, and,
/// with `bias`, "bias" (out_features), replicated: the same on every rank and
/// not a shard (not declared by `tensor_parallel_shards`; its gradient is
/// the same on every rank). forward(x_local): x_local (…, cols_r), this
/// rank's slice of the input features (a ColumnParallelLinear's output) →
/// (…, out_features), whole and the same on every rank; collective over
/// `tp` (one all-reduce of the output).
///
/// Initialization as ColumnParallelLinear: the whole weight and bias drawn as
/// torch::nn::Linear(in_features, out_features) draws them, this rank keeping
/// its columns and the whole bias.
class RowParallelLinearImpl : public ParallelLinearBase {
 public:
  /// `cols_per_rank`: columns of every rank's block, in rank order; empty
  /// means balanced_split_sizes(in_features, tp.size()). Not collective.
  /// Raises c10::ValueError for in_features < 1, out_features < 1, an invalid
  /// `tp`, or cols_per_rank without one entry ≥ 0 per rank summing to
  /// in_features.
  RowParallelLinearImpl(int64_t in_features, int64_t out_features, Group tp, bool bias = true,
                        std::vector<int64_t> cols_per_rank = {});

  /// reduce_from_tensor_parallel(linear(x_local, weight), tp) + bias: the
  /// whole output on every rank. Collective over `tp`.
  at::Tensor forward(const at::Tensor& x_local);

  /// Columns of every rank's block, in rank order.
  const std::vector<int64_t>& cols_per_rank() const { return sizes_per_rank_; }
};
TORCH_MODULE(RowParallelLinear);

}  // namespace muon::distributed
