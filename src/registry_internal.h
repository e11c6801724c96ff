// Declarations shared by the files of the registry (registry.cpp,
// registry_builtins.cpp, resolve.cpp, make_optimizer.cpp); not installed.
#pragma once

#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "muon/optim/adaptive_muon.h"
#include "muon/registry.h"

namespace muon::detail {

/// Prefix of the registry's error messages.
constexpr const char* kRegistryWho = "[muon::OptimizerRegistry] ";
/// Prefix of make_optimizer's (and the resolution's) error messages.
constexpr const char* kMakeWho = "[muon::make_optimizer] ";

/// The settings `entry` reads from a parameter's values: the registry's
/// shared fields, then the option fields of uses_fields_of, then its own,
/// prefixes stripped.
OptimizerSettings settings_for(const OptimizerRegistry& registry, const OptimizerEntry& entry,
                               const std::map<std::string, FieldValue>& values);

/// Every parameter resolved by the rules (the entry's defaults, then the
/// user's); `group` not yet numbered. A user rule that matches nothing is an
/// error unless `allow_unmatched`.
std::vector<ResolvedParameter> resolve_rules(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const OptimizerRegistry& registry, bool allow_unmatched = false);

/// Runs the functions given to OptimizerRegistry::extend_global on the new
/// global `registry` (before global() returns it); those given later run at once.
void run_global_extensions(OptimizerRegistry& registry);

/// The second-moment settings of an adaptive_muon group.
AdaptiveMuonOptions adaptive_muon_options(const OptimizerSettings& settings);

/// Scion's default rule (src/optim/orthogonalized_family.cpp): on the
/// parameters scion steps, weight_decay 1 and muon_nesterov false, the values
/// Scion fixes (OrthogonalizedVariant refuses others).
OverrideRule scion_fixed_rule();

/// Parameters of one optimizer with identical settings: one param group.
struct ParamGroupPlan {
  /// The optimizer.
  std::string optimizer;
  /// The tensors, in the order given.
  std::vector<at::Tensor> params;
  /// Their names.
  std::vector<std::string> names;
  /// Their indices into the resolved parameters.
  std::vector<size_t> members;
  /// The group's settings.
  std::unique_ptr<OptimizerSettings> settings;
};

/// The param groups of `resolved` (aliases skipped), and `group` of every
/// resolved parameter numbered as the composite will: by optimizer in
/// registry order.
std::vector<ParamGroupPlan> group_parameters(
    const torch::OrderedDict<std::string, at::Tensor>& named,
    std::vector<ResolvedParameter>& resolved, const OptimizerRegistry& registry);

/// The composite over `groups`, one param group each (never merged), parts
/// in registry order, each part's groups in the order given; built by
/// `context`'s factory where it has one, else the entry's (after the
/// extensions' check_own_factory). `index[i]` receives group i's place in
/// the composite. A bad setting raises c10::ValueError "<who><describe(i)>:
/// <cause>"; a factory's error "<who>optimizer '<name>': <cause>".
std::unique_ptr<CompositeOptimizer> build_composite(const std::vector<ParamGroupPlan>& groups,
                                                    const BuildContext& context,
                                                    const OptimizerRegistry& registry,
                                                    const char* who,
                                                    const std::function<std::string(size_t)>& describe,
                                                    std::vector<int64_t>& index);

}  // namespace muon::detail
