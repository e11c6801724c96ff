#pragma once

/// Sharded data parallelism (ZeRO-2) for a model whose modules hold full
/// parameters: gradients are reduce-scattered, each rank keeps the optimizer
/// state and a master copy of only its rows of every parameter, and the
/// updated rows are all-gathered back into the full parameters.
///
///     auto world = muon::distributed::init_from_env();
///     auto config = muon::OptimizerConfig().set("optimizer", "muon").set("lr", 0.02);
///     muon::distributed::ShardedDataParallel dp(model->named_parameters(), config, world);
///     for (...) {
///       dp.zero_grad();
///       loss_of(model, batch_of(world.rank())).backward();
///       dp.step();  // reduce-scatter, step on the shards, all-gather
///     }
///
/// Every parameter (any dim >= 1) is split by rows (dim 0) over the
/// data-parallel group `dp` with `balanced_split_sizes(size(0), dp.size())`;
/// shards may be uneven or empty (1 row over 3 ranks). The optimizer is
/// `muon::distributed::make_optimizer` with the config's `layout` set to "sharded"
/// over the shards (muon/distributed/layouts/make.h), so Muon matrices are
/// orthogonalized whole by one owner rank (muon/distributed/layouts/sharded_muon.h) and
/// element-wise optimizers (AdamW, Lion, ...) run on the shards: each rank
/// holds about 1/W of the optimizer state, and the full parameters equal
/// one process stepping the whole tensors with the gradient averaged over
/// the ranks.
///
/// A step (Layout::step), collective over `dp`:
///  1. the step's agreement (muon/distributed/layouts/layout.h): one all-gather of
///     a few integers (gradients present and fitting, the optimizer's
///     checks and settings, non-finite gradients under the optimizer's
///     policy, config field `nonfinite`);
///  2. the gradients are reduce-scattered in buckets of about `bucket_bytes`
///     (an all-to-all per bucket: rank r receives every rank's copy of its
///     rows, sums them in rank order and divides by W; the next bucket's
///     all-to-all runs while the current one is summed);
///  3. the optimizer steps the shards;
///  4. the updated rows are all-gathered into the full parameters, in
///     buckets, in place.
///
/// 2-D layout (tensor parallel inside, sharded data parallel outside, the
/// groups from `Group::mesh`): a parameter named in `tensor_parallel` is this
/// rank's TP block of a larger matrix; its rows are split over `dp` as any
/// other parameter, and Muon orthogonalizes the whole matrix over the TP
/// group in `tp_mode`. Steps are then collective over the TP groups too.
///
/// Checkpoints: `save_checkpoint(dir, dp, step)` and `load_checkpoint(path,
/// dp)` (muon/distributed/checkpoints/checkpoint.h: its shards in its layout, and
/// the rows gathered after a load); a checkpoint saved at W ranks loads at
/// any other number. In a 2-D layout pass the world as
/// `CheckpointOptions::group` (or build a Layout with LayoutGroups::world).
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "muon/config.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"
#include "muon/registry.h"

namespace muon::distributed {

/// Default bytes of full gradients (and of full parameters) per bucket.
constexpr int64_t kDefaultDataParallelBucketBytes = int64_t{4} << 20;

/// Options of `ShardedDataParallel`.
struct ShardedDataParallelOptions {
  /// Bytes of full gradients each reduce-scatter bucket packs (and of full
  /// parameters each all-gather bucket fills), >= 1. A parameter larger than
  /// this is a bucket of its own; parameters of different dtypes or devices
  /// never share one.
  TORCH_ARG(int64_t, bucket_bytes) = kDefaultDataParallelBucketBytes;
  /// How Muon orthogonalizes the TP blocks named in `tensor_parallel` (2-D
  /// layout); unused without them.
  TORCH_ARG(TensorParallelMode, tp_mode) = TensorParallelMode::kDistributed;
};

/// ZeRO-2 data parallelism over `dp` (see the top of this header): the
/// Layout of kind "sharded" (muon/distributed/layouts/layout.h) built from a
/// data-parallel group, with accessors of its rows. Holds references to the
/// full parameters it was given (the model's tensors) and owns the master
/// shards and the optimizer over them.
///
/// Construction is collective over `dp` (and the TP groups): the ranks
/// compare their parameter names, shapes and dtypes, the checksums of their
/// values (data-parallel replicas start equal: broadcast them first,
/// muon::distributed::broadcast_parameters) and their configs, and raise the same
/// c10::ValueError on every rank naming the first difference. Raises
/// c10::ValueError for an invalid group, a 0-d or undefined parameter
/// (naming it), a `tensor_parallel` entry naming no parameter, a config
/// `layout` other than "none" or "sharded", a bad option (naming it and its
/// value), and anything make_optimizer raises.
///
/// `step()` (Layout::step) agrees, averages the full parameters' gradients
/// over `dp` into the shards' gradients, steps the optimizer on the shards
/// and all-gathers the updated rows into the full parameters (in place,
/// without autograd). A parameter without a gradient is skipped; it must
/// lack one on every rank, else every rank raises the same c10::ValueError
/// naming it and the ranks that have one. Whenever it raises or skips, and
/// when the optimizer raises, the full parameters are unchanged.
class ShardedDataParallel : public Layout {
 public:
  ShardedDataParallel(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                      const OptimizerConfig& config, Group dp,
                      std::map<std::string, TensorParallelShard> tensor_parallel = {},
                      ShardedDataParallelOptions options = {},
                      const OptimizerRegistry& registry = OptimizerRegistry::global());

  /// Copies every rank's shards into the full parameters (collective over
  /// `dp`): after loading a checkpoint into `shards()`, or after changing
  /// them in any other way.
  void gather_parameters() { parameters_loaded(); }
  /// This rank's master shards (its rows of every parameter), by parameter
  /// name, in the order given.
  const torch::OrderedDict<std::string, at::Tensor>& shards() const;
  /// group = dp and a RowShard (global shape, dp) for every parameter, with
  /// its tensor-parallel block where it has one: what save_checkpoint and
  /// load_checkpoint take with `shards()`.
  const DistributedLayout& layout() const { return checkpoint_layout(); }
  /// The data-parallel group.
  const Group& group() const { return dp(); }
  /// The options it was built with.
  const ShardedDataParallelOptions& options() const { return options_; }
  /// Rows of parameter `name` held by each rank of `dp`, in rank order.
  /// Raises c10::ValueError naming an unknown `name`.
  const std::vector<int64_t>& rows_per_rank(const std::string& name) const;
  /// The first row of parameter `name` this rank holds. Raises as
  /// rows_per_rank.
  int64_t row_offset(const std::string& name) const;
  /// Bytes of this rank's full parameters plus its master shards.
  int64_t parameter_bytes() const;
  /// Number of buckets each step's reduce-scatter (and all-gather) uses.
  size_t bucket_count() const;

 private:
  ShardedDataParallelOptions options_;
};

}  // namespace muon::distributed
