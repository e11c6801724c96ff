#pragma once

/// One face for every way of splitting a training step over processes: the
/// gradient reduction, the optimizer and its strategy, the gathering of the
/// updated parameters, the checkpoint view, and one agreement per step.
///
///     auto world = muon::distributed::init_from_env();
///     auto config = muon::OptimizerConfig().set("optimizer", "muon").set("layout", "sharded");
///     muon::distributed::Layout layout(model->named_parameters(), config, muon::distributed::LayoutGroups().world(world));
///     for (...) {
///       layout.zero_grad();
///       loss_of(model, batch_of(world.rank())).backward();
///       layout.step();  // agree, average the gradients, step, gather
///     }
///     muon::distributed::save_checkpoint(dir, layout, step);
///
/// What a config's `layout` field builds (the data-parallel group `dp`
/// averages the gradients of ranks that saw different data):
///
///   layout           gradients over dp          optimizer (the strategy underneath)
///   none             all-reduce (none at 1)     the config's optimizer on every rank (replicated)
///   layerwise        all-reduce                 LayerwiseOptimizer: one owner per parameter, all-gather
///   tensor_parallel  all-reduce (none at 1)     Muon parts with the tensor-parallel strategy on the blocks
///                                               named in `tensor_parallel` (TensorParallelMuon)
///   sharded          reduce-scatter into rows   Muon parts with the row-shard owner-compute strategy on
///                                               this rank's rows (ShardedMuon), updated rows all-gathered;
///                                               with `tensor_parallel` blocks, the 2-D layout;
///                                               soap parts as ShardedSoap (owner-compute)
///   sharded + row_shards  none (the parameters are an FSDP's row shards, their gradients already
///                    reduce-scattered)          ShardedMuon on the shards as they are
///
/// A step:
///  1. one agreement, one all-gather of a few integers over `world` (over
///     `dp` and then each TP group when `world` is not given): which
///     gradients are present (every rank the same), that each fits its
///     parameter, the optimizer's own checks (its options, what it can
///     step), a digest of every param group's settings (a rank whose lr was
///     changed alone is named with the setting; in the layer-wise layout,
///     whose ranks hold the groups of the parameters they own, settings are
///     compared when it is built), and the non-finite policy
///     (config field `nonfinite`) on the gradients as they are before the
///     reduction. The average of finite gradients is finite unless their sum
///     overflows: only when a gradient is that large (|g| above the dtype's
///     largest value / (2 · dp ranks)) is the reduced gradient checked again,
///     with one more small collective;
///  2. the gradient reduction over `dp` (bucketed, overlapped);
///  3. the optimizer's step, which runs no check of its own across ranks
///     (StepGuard::set_agreed_by_layout);
///  4. the sharded layout all-gathers the updated rows into the parameters.
/// A failed check raises the same c10::ValueError on every rank and changes
/// no parameter, no optimizer state and no step count; under skip_step every
/// rank skips together (skipped_steps()).
///
/// Checkpoints: `save_checkpoint(dir, layout, step)` and
/// `load_checkpoint(path, layout)` (muon/distributed/checkpoints/checkpoint.h) save
/// and load `checkpoint_parameters()` in `checkpoint_layout()` over
/// `world`, and after a load gather the sharded layout's rows into the
/// parameters: a checkpoint of any layout and world size loads into any other.
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
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/row_shard.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"
#include "muon/groups.h"
#include "muon/registry.h"

namespace muon::distributed {

namespace detail {
class RowShards;
}  // namespace detail

/// Tensor-parallel blocks by parameter name.
using TensorParallelShards = std::map<std::string, TensorParallelShard>;
/// Row shards by parameter name.
using RowShards = std::map<std::string, RowShard>;

/// How a layout combines the gradients of the data-parallel ranks.
enum class GradientReduction {
  /// Not at all: one data-parallel rank, or gradients reduced elsewhere (an FSDP).
  kNone,
  /// Every rank gets the average of every gradient (DDP).
  kAllReduce,
  /// Each rank gets the average of its rows of every gradient (ZeRO-2).
  kReduceScatter,
};

/// "none" | "all_reduce" | "reduce_scatter".
std::string to_string(GradientReduction reduction);

/// The processes of a layout and how the parameters are split over them.
struct LayoutGroups {
  /// Every rank of the layout: the step's agreement and checkpoints run
  /// over it. Invalid (the default): `dp`, or one process.
  TORCH_ARG(Group, world);
  /// The ranks that average their gradients (data parallel). Invalid (the
  /// default): `world`, or one process.
  TORCH_ARG(Group, dp);
  /// Tensor-parallel blocks by parameter name (layout tensor_parallel, or
  /// sharded for the 2-D layout); their groups come with them.
  TORCH_ARG(TensorParallelShards, tensor_parallel);
  /// Row shards by parameter name: the parameters are already an FSDP's row
  /// shards (layout sharded, gradient reduction none).
  TORCH_ARG(RowShards, row_shards);
  /// Bytes of gradients (and parameters) each reduction and gather bucket packs, >= 1.
  TORCH_ARG(int64_t, bucket_bytes) = int64_t{4} << 20;
  /// How Muon orthogonalizes the blocks of a 2-D layout.
  TORCH_ARG(TensorParallelMode, tp_mode) = TensorParallelMode::kDistributed;
  /// Gradients are averaged over `dp` elsewhere (e.g. by PyTorch's DDP or
  /// FSDP2): the layout does no reduction of its own.
  TORCH_ARG(bool, gradients_reduced) = false;
};

/// A training step laid out over processes (see the top of this header).
/// Construction is collective over every group the layout uses: the ranks
/// compare their configs, their parameter names (and, where replicas must
/// start equal, shapes, dtypes and values), and raise the same
/// c10::ValueError on every rank naming the first difference. Raises
/// c10::ValueError for a layout whose information is missing or does not
/// fit (an invalid group where one is needed, a shard naming no parameter,
/// row shards with another layout), naming it.
class Layout {
 public:
  /// The layout the config's `layout` field names, over `named_parameters`
  /// (this rank's tensors: whole, TP blocks or row shards as `groups` says).
  Layout(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
         const OptimizerConfig& config, LayoutGroups groups = {},
         const OptimizerRegistry& registry = OptimizerRegistry::global());
  /// The same over explicit param groups (muon::plan_groups gives those a
  /// config describes; one param group each, never merged). Not for the
  /// sharded layout with reduce-scatter (give named parameters).
  Layout(const std::vector<GroupSpec>& groups, const OptimizerConfig& config,
         LayoutGroups layout_groups = {},
         const OptimizerRegistry& registry = OptimizerRegistry::global());
  /// An optimizer built elsewhere (e.g. LibTorch's AdamW) over
  /// `named_parameters`, replicated on the ranks of `groups.dp()` with
  /// all-reduced gradients: the layout `none` around it. Its checkpoints
  /// hold `named_parameters` in `checkpoint_layout` (default: whole tensors).
  Layout(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
         std::unique_ptr<torch::optim::Optimizer> optimizer, LayoutGroups groups = {},
         DistributedLayout checkpoint_layout = {});
  ~Layout();
  Layout(Layout&&) noexcept;
  Layout& operator=(Layout&&) noexcept;
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;

  /// Sets every gradient the layout holds to undefined (parameters and
  /// shards), as torch's `zero_grad(set_to_none=true)`. Not collective.
  void zero_grad();
  /// The step's agreement and the gradient reduction (steps 1 and 2 above),
  /// for a caller that times them apart from the optimizer; step() does them
  /// when they were not done since the last step. Collective.
  void reduce_gradients();
  /// One training step (see the top of this header). Collective.
  void step();

  /// The optimizer (learning-rate schedules set its rates; its `step()`
  /// alone neither agrees nor reduces nor gathers).
  torch::optim::Optimizer& optimizer();
  const torch::optim::Optimizer& optimizer() const;
  /// The config's layout: "none", "layerwise", "tensor_parallel" or "sharded".
  const std::string& kind() const { return kind_; }
  /// The layout in words: "single process", "replicated 4", "layer-wise 4",
  /// "tensor parallel 2", "sharded 4", "2-D 2 x 2", "sharded (FSDP) 4".
  std::string describe() const;
  /// How gradients are combined over `dp`.
  GradientReduction reduction() const { return reduction_; }
  /// Every rank of the layout.
  const Group& world() const { return world_; }
  /// The data-parallel ranks.
  const Group& dp() const { return dp_; }
  /// The parameters given, by name, in order.
  const torch::OrderedDict<std::string, at::Tensor>& parameters() const { return params_; }
  /// What checkpoints save and load: the parameters, or this rank's rows of
  /// them in the sharded layout.
  const torch::OrderedDict<std::string, at::Tensor>& checkpoint_parameters() const;
  /// How `checkpoint_parameters()` lie over the ranks.
  const DistributedLayout& checkpoint_layout() const;
  /// After `checkpoint_parameters()` changed (a checkpoint loaded into
  /// them): makes the parameters equal to them (the sharded layout gathers
  /// its rows; collective there). load_checkpoint(path, layout) calls it.
  void parameters_loaded();
  /// Bytes of parameters the layout holds besides the ones given (master rows).
  int64_t extra_parameter_bytes() const;
  /// Bytes of this rank's optimizer state (muon::optimizer_state_bytes).
  int64_t state_bytes() const;
  /// Built from GroupSpecs: for each, the index of its param group in
  /// `optimizer().param_groups()`, or -1 when none of its parameters steps
  /// on this rank (layer-wise). Empty otherwise.
  const std::vector<int64_t>& group_index() const { return group_index_; }
  /// Steps skipped on every rank for a non-finite gradient (skip_step policy).
  int64_t skipped_steps() const { return skipped_; }
  /// Multiplies row i (dim 0) of parameter `name` as given to the layout
  /// (whole, a tensor-parallel block or a row shard) by `factors[i]` in
  /// place, and the same rows of the master copy this rank holds (the
  /// sharded layout's rows of it), each rounded once (muon::scale_rows_):
  /// the parameters and their master rows stay equal. Rows whose factor is
  /// 1 are untouched. Not collective. Raises c10::ValueError for an unknown
  /// name or `factors` not 1-D of the parameter's rows, changing nothing.
  /// QK-clip (muon/distributed/layouts/qk_clip.h) scales query and key rows with it.
  void scale_rows(const std::string& name, const at::Tensor& factors);

 protected:
  /// The sharded layout's rows of every parameter (reduce-scatter only).
  const detail::RowShards& rows() const;
  /// Prefix of the step's messages (a class built on Layout names itself).
  void set_who(std::string who) { who_ = std::move(who); }

 private:
  void build(const torch::OrderedDict<std::string, at::Tensor>* named_parameters,
             const std::vector<GroupSpec>* groups, const OptimizerConfig& config,
             LayoutGroups layout_groups, const OptimizerRegistry& registry);
  void set_groups(LayoutGroups& groups);

  std::string kind_ = "none";
  std::string who_ = "[muon::distributed::Layout] ";
  GradientReduction reduction_ = GradientReduction::kNone;
  Group world_;
  Group dp_;
  std::vector<Group> peers_;  // when no world: dp then each distinct TP group
  int64_t bucket_bytes_ = int64_t{4} << 20;
  torch::OrderedDict<std::string, at::Tensor> params_;
  DistributedLayout checkpoint_layout_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<detail::RowShards> rows_;
  std::vector<int64_t> group_index_;
  std::vector<bool> active_;
  bool reduced_ = false;
  bool skip_ = false;
  int64_t skipped_ = 0;
};

}  // namespace muon::distributed
