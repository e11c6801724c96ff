#pragma once

/// Param groups laid out explicitly, as torch.optim's param_groups are: the
/// groups `make_optimizer` would build from a config (`plan_groups`), the
/// fields a group carries (`group_fields`) and a group's complete settings
/// (`group_settings`). The Python package builds its optimizers on these,
/// with or without a distributed layout; muon::distributed::make_grouped_optimizer
/// (muon/distributed/layouts/make.h) builds an optimizer over such groups.
///
///     auto plan = muon::plan_groups(model->named_parameters(), config);
///     plan[0].settings["lr"] = 0.01;  // one group's learning rate
///     auto s = muon::group_settings(plan[0].optimizer, plan[0].settings, config);
#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

#include <map>
#include <string>
#include <vector>

#include "muon/config.h"
#include "muon/registry.h"

namespace muon {

/// One param group laid out by the caller, as torch.optim's param_groups are:
/// the optimizer it goes to, its parameters with their names, and its
/// settings under OptimizerSettings' keys (the shared fields such as `lr`
/// and `weight_decay`, and the optimizer's option fields without the prefix:
/// `momentum`, `ns_eps`, ...). A key left out takes the config's value.
struct GroupSpec {
  /// Registered optimizer name ("muon", "adamw", ...).
  std::string optimizer;
  /// One name per parameter, unique over all groups.
  std::vector<std::string> names;
  /// The parameters (this rank's tensors, as for make_optimizer).
  std::vector<at::Tensor> params;
  /// Settings that differ from the config's.
  std::map<std::string, FieldValue> settings;
};

/// The param groups `make_optimizer(named_parameters, config)` builds (and
/// muon::distributed::make_optimizer for every layout but layerwise), in its group
/// order, each with its complete settings: the registry's default rules and
/// the config's override rules applied, parameters with equal settings
/// together. Raises c10::ValueError for no parameters, and as
/// resolve_parameters.
std::vector<GroupSpec> plan_groups(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                                   const OptimizerConfig& config,
                                   const OptimizerRegistry& registry = OptimizerRegistry::global());

/// The complete settings of a group of `optimizer`: the config's values,
/// then `settings` (each checked against its field: c10::ValueError naming
/// the key and the value; an unknown key raises listing the known ones).
OptimizerSettings group_settings(const std::string& optimizer,
                                 const std::map<std::string, FieldValue>& settings,
                                 const OptimizerConfig& config,
                                 const OptimizerRegistry& registry = OptimizerRegistry::global());

/// The option fields a group of `optimizer` carries (the shared per-parameter
/// fields `lr` and `weight_decay`, then the optimizer's own, without the
/// prefix), with their types, defaults and checks.
std::vector<FieldSpec> group_fields(const std::string& optimizer,
                                    const OptimizerRegistry& registry = OptimizerRegistry::global());

}  // namespace muon
