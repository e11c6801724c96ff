#pragma once

/// The registry's entry point for distributed layouts: the optimizer a
/// config describes, laid out as the config's `layout` field says.
///
///     auto world = muon::distributed::init_from_env();
///     auto config = muon::OptimizerConfig().set("optimizer", "muon").set("layout", "layerwise");
///     muon::distributed::DistributedLayout layout;
///     layout.group = world;
///     auto opt = muon::distributed::make_optimizer(model->named_parameters(), config, layout);
///
/// layout (config field)  needs in DistributedLayout                builds
///   none                 nothing                                  muon::make_optimizer
///   layerwise            group (the data-parallel group)          LayerwiseOptimizer over the config's optimizer
///   tensor_parallel      tensor_parallel shards by name           Muon-family parts with the TP strategy (muon_tp_mode)
///   sharded              row_shards by name (every Muon matrix)   Muon-family parts with the row-shard strategy (layout_sharded_mode),
///                                                                 soap parts as ShardedSoap (owner-compute)
///
/// The config fields of the layouts (`layout`, `layout_sharded_mode`,
/// `layout_max_in_flight`, `layout_bucket_mb`, `muon_tp_mode`) belong to this
/// layer: `register_config_fields` adds them to a registry's schema, and
/// this layer adds them to the global registry when it is created
/// (OptimizerRegistry::extend_global), so every config made from it has them
/// whenever the library is linked.
///
/// In the tensor_parallel and sharded layouts, muon parts are
/// TensorParallelMuon / ShardedMuon, and the parts of every other Muon-family
/// entry (adaptive_muon, polargrad, scion, spel, muon_hyperball, mop: those
/// with an `OptimizerEntry::strategy_factory`) that entry's optimizer with
/// the same strategy (a stage's state lives with the local part, its
/// whole-matrix statistics are summed over the parts, and it equals one
/// process); the other optimizers (AdamW, Lion, ...) are element-wise and run
/// on the local shards as they are. soap needs whole matrices: in the sharded
/// layout its parts are muon::distributed::ShardedSoap (each matrix's owner steps it
/// whole, muon/distributed/layouts/sharded_soap.h); tensor_parallel and the 2-D
/// layout (row shards with tensor-parallel blocks) refuse it with
/// c10::ValueError naming soap and the layout.
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "muon/config.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"
#include "muon/groups.h"
#include "muon/registry.h"

namespace muon::distributed {

/// What the distributed layouts need beyond the config.
struct DistributedLayout {
  /// The data-parallel group (layerwise). Row shards and tensor-parallel
  /// shards name their own groups.
  Group group;
  /// Tensor-parallel shards by parameter name (layout tensor_parallel).
  std::map<std::string, TensorParallelShard> tensor_parallel;
  /// Row shards by parameter name (layout sharded): every parameter that
  /// goes to Muon needs one.
  std::map<std::string, RowShard> row_shards;
};

/// Adds the layouts' config fields to `registry` as a ConfigExtension named
/// "muon::distributed": the whole-run `layout` (none | tensor_parallel | sharded |
/// layerwise), `layout_sharded_mode`, `layout_max_in_flight` and
/// `layout_bucket_mb`, and Muon's per-parameter `tp_mode` (config field
/// `muon_tp_mode`: duplicated | distributed | blockwise), with the check that
/// makes single-process muon::make_optimizer reject a muon_tp_mode other than
/// "duplicated". The global registry has them; call it on a registry of your
/// own (after registering "muon") to use that registry here. Raises
/// c10::ValueError as OptimizerRegistry::extend (e.g. when called twice).
void register_config_fields(OptimizerRegistry& registry);

/// The optimizer `config` describes over `named_parameters` (this rank's
/// tensors: whole, TP blocks or row shards as the layout says), laid out as
/// its `layout` field says (table at the top). Collective for every layout
/// but none, and for every layout when `layout.group` is valid: the ranks of
/// that group first compare their configs (every field and override rule)
/// and raise c10::ValueError on every rank naming the first field that
/// differs ("config field 'lr' is 0.01 on rank 1, 0.02 on rank 0"); the
/// layouts then compare what they built (muon/distributed/runtime/agreement.h).
/// Raises c10::ValueError for a layout whose information is missing (an
/// invalid group, a Muon parameter without a row shard, a shard named after
/// no parameter).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    const OptimizerConfig& config, const DistributedLayout& layout,
    const OptimizerRegistry& registry = OptimizerRegistry::global());

/// An optimizer built from explicit groups, and where each group landed.
struct GroupedOptimizer {
  /// The optimizer (a CompositeOptimizer, or a LayerwiseOptimizer around one).
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  /// For each GroupSpec, the index of its group in `optimizer->param_groups()`,
  /// or -1 when none of its parameters is stepped on this rank (layerwise:
  /// other ranks own them all).
  std::vector<int64_t> group_index;
};

/// The optimizer over `groups` (muon::GroupSpec, muon/groups.h; one param
/// group each, never merged, so that a caller can change one group's
/// options; muon::plan_groups gives those a config describes), laid out as
/// the config's `layout` says with `layout`'s groups and shards (see
/// make_optimizer; the whole-run fields, such as the layout's and
/// `nonfinite`, come from `config`). Collective as make_optimizer. Raises c10::ValueError for an
/// empty group list, an unknown optimizer or setting, a bad value (naming the
/// group, the key and the value), duplicate names or tensors.
GroupedOptimizer make_grouped_optimizer(const std::vector<GroupSpec>& groups,
                                        const OptimizerConfig& config,
                                        const DistributedLayout& layout,
                                        const OptimizerRegistry& registry = OptimizerRegistry::global());

}  // namespace muon::distributed
