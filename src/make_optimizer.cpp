// make_optimizer: the composite optimizer a config describes, and the LR
// schedule it describes.
#include <c10/util/Exception.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "muon/optim/step_guard.h"
#include "muon/optim/weight_update_hook.h"
#include "muon/registry.h"
#include "registry_internal.h"
#include "util/names.h"

namespace muon {

using detail::join;
using detail::kMakeWho;
using torch::optim::OptimizerParamGroup;

namespace detail {
namespace {

// The weight-update hook of one param group of `entry` (nullopt: none);
// raises c10::ValueError for an optimizer whose step the hooks cannot read.
std::optional<WeightUpdateHooks::Group> group_hook(const OptimizerEntry& entry, const OptimizerSettings& s) {
  if (!s.has("weight_update_hook")) return std::nullopt;
  const auto kind = parse_weight_update_hook(s.get_string("weight_update_hook"));
  if (kind == WeightUpdateHookKind::kNone) return std::nullopt;
  TORCH_CHECK_VALUE(!entry.hook_weight_decay.empty(), "weight_update_hook '", to_string(kind),
                    "' cannot wear optimizer '", entry.name, "': ", entry.hook_refusal);
  WeightUpdateHooks::Group g;
  g.hook.kind(kind)
      .radius(s.get_double("weight_update_hook_radius"))
      .outward_scale(s.get_double("weight_update_hook_outward_scale"))
      .inward_scale(s.get_double("weight_update_hook_inward_scale"))
      .eps(s.get_double("weight_update_hook_eps"));
  g.hook.validate();
  g.weight_decay = s.get_double("weight_decay");
  g.weight_decay_of = entry.hook_weight_decay_of;
  std::string method = entry.hook_weight_decay;
  std::string field = "optimizer '" + entry.name + "''s weight decay";
  for (const char* name : {"weight_decay_mode", "weight_decay_method"}) {
    if (s.has(name)) {
      method = s.get_string(name);
      field = std::string(entry.name) + "'s " + name;
    }
  }
  g.decay = try_parse_hooked_weight_decay(method);
  if (!g.decay) {
    // Without weight decay, how it would decay does not matter; a later
    // coefficient other than 0 raises at the step (WeightUpdateHooks::check).
    if (g.weight_decay != 0) parse_hooked_weight_decay(method, field);  // raises, naming the field
    g.decay_refusal = hooked_weight_decay_refusal(method, field);
  }
  return g;
}

}  // namespace

std::unique_ptr<CompositeOptimizer> build_composite(const std::vector<ParamGroupPlan>& groups,
                                                    const BuildContext& context,
                                                    const OptimizerRegistry& registry,
                                                    const char* who,
                                                    const std::function<std::string(size_t)>& describe,
                                                    std::vector<int64_t>& index) {
  index.assign(groups.size(), -1);
  const auto extensions = registry.extensions();
  std::vector<CompositePart> parts;
  int64_t next = 0;
  for (const auto& name : registry.keys()) {
    const auto entry = registry.at(name);
    std::vector<OptimizerParamGroup> part_groups;
    std::vector<OptimizerSettings> settings;
    std::vector<std::optional<WeightUpdateHooks::Group>> hooks;
    CompositePart part;
    part.name = name;
    const bool replaced = context.factories.count(name) != 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const auto& b = groups[i];
      if (b.optimizer != name) continue;
      try {
        if (!replaced) {
          for (const auto& x : extensions) {
            if (x->check_own_factory) x->check_own_factory(name, *b.settings);
          }
        }
        part_groups.emplace_back(b.params, entry->make_options(*b.settings));
        hooks.push_back(group_hook(*entry, *b.settings));
      } catch (const c10::ValueError& e) {
        TORCH_CHECK_VALUE(false, who, describe(i), ": ", e.what_without_backtrace());
      }
      settings.push_back(*b.settings);
      part.group_names.push_back(b.names);
      index[i] = next++;
    }
    if (part_groups.empty()) continue;
    try {
      part.optimizer = replaced ? context.factories.at(name)(std::move(part_groups), settings)
                                : entry->factory(std::move(part_groups), settings);
    } catch (const c10::ValueError& e) {
      TORCH_CHECK_VALUE(false, who, "optimizer '", name, "': ", e.what_without_backtrace());
    }
    TORCH_CHECK_VALUE(part.optimizer != nullptr, who, "the factory of '", name, "' returned null");
    if (entry->init_state) entry->init_state(*part.optimizer);
    auto part_hooks = std::make_shared<WeightUpdateHooks>(std::move(hooks), context.sum_across_parts);
    if (part_hooks->any()) part.hooks = std::move(part_hooks);
    parts.push_back(std::move(part));
  }
  return std::make_unique<CompositeOptimizer>(std::move(parts));
}

}  // namespace detail

std::unique_ptr<CompositeOptimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const OptimizerRegistry& registry) {
  return make_optimizer(named, config, BuildContext(), registry);
}

std::unique_ptr<CompositeOptimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const BuildContext& context, const OptimizerRegistry& registry) {
  TORCH_CHECK_VALUE(!named.is_empty(), kMakeWho, "no parameters given");
  for (const auto& item : context.factories) {
    TORCH_CHECK_VALUE(registry.has(item.first), kMakeWho, "BuildContext replaces the factory of '",
                      item.first, "', which is not registered; registered: ", join(registry.keys()));
  }
  auto resolved = detail::resolve_rules(named, config, registry, context.allow_unmatched_rules);
  const auto builds = detail::group_parameters(named, resolved, registry);
  std::vector<int64_t> index;
  auto optimizer = detail::build_composite(
      builds, context, registry, kMakeWho,
      [&](size_t i) { return "optimizer '" + builds[i].optimizer + "' for parameters " + join(builds[i].names); },
      index);
  optimizer->set_nonfinite(parse_nonfinite_policy(config.get_string("nonfinite")));
  return optimizer;
}

LrScheduleOptions lr_schedule_options(const OptimizerConfig& config) {
  return LrScheduleOptions()
      .lr(config.get_double("lr"))
      .min_lr(config.get_double("min_lr"))
      .warmup_steps(config.get_int("lr_warmup_steps"))
      .warmup_init(config.get_double("lr_warmup_init"))
      .decay_steps(config.get_int("lr_decay_steps"))
      .style(config.get_string("lr_decay_style"));
}

}  // namespace muon
