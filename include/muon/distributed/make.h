#pragma once

/// The registry's entry point for distributed layouts: the optimizer a
/// config describes, laid out as the config's `layout` field says.
///
///     auto world = muon::dist::init_from_env();
///     auto config = muon::OptimizerConfig().set("optimizer", "muon").set("layout", "layerwise");
///     muon::dist::DistributedLayout layout;
///     layout.group = world;
///     auto opt = muon::dist::make_optimizer(model->named_parameters(), config, layout);
///
/// layout (config field)  needs in DistributedLayout                builds
///   none                 nothing                                  muon::make_optimizer
///   layerwise            group (the data-parallel group)          LayerwiseOptimizer over the config's optimizer
///   tensor_parallel      tensor_parallel shards by name           Muon parts as TensorParallelMuon (muon_tp_mode)
///   sharded              row_shards by name (every Muon matrix)   Muon parts as ShardedMuon (layout_sharded_mode)
///
/// In the tensor_parallel and sharded layouts the other optimizers (AdamW,
/// Lion, ...) are element-wise and run on the local shards as they are;
/// adaptive_muon is rejected there (its second moment is not sharded yet).
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <map>
#include <memory>
#include <string>

#include "muon/config.h"
#include "muon/distributed/group.h"
#include "muon/distributed/shard.h"
#include "muon/distributed/sharded.h"
#include "muon/registry.h"

namespace muon::dist {

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

/// The optimizer `config` describes over `named_parameters` (this rank's
/// tensors: whole, TP blocks or row shards as the layout says), laid out as
/// its `layout` field says (table at the top). Collective for every layout
/// but none. Raises c10::ValueError for a layout whose information is
/// missing (an invalid group, a Muon parameter without a row shard, a shard
/// named after no parameter) and for adaptive_muon in the tensor_parallel
/// and sharded layouts.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    const OptimizerConfig& config, const DistributedLayout& layout,
    const OptimizerRegistry& registry = OptimizerRegistry::global());

}  // namespace muon::dist
