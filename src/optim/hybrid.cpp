// Muon + AdamW as one optimizer over named parameters.
#include "muon/optim/hybrid.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <memory>
#include <unordered_map>
#include <utility>

#include "muon/compat.h"

namespace muon {
namespace {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::OptimizerParamGroup;

constexpr const char* kWho = "[muon::MuonWithAdamW] ";

// One param group under construction.
struct PendingGroup {
  std::string pattern;  // empty: the default group of its side
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<size_t> decisions;  // indices into the routing
};

template <typename Options>
int first_pattern(const std::vector<std::pair<std::string, Options>>& groups,
                  const std::string& name) {
  for (size_t i = 0; i < groups.size(); ++i) {
    if (glob_match(groups[i].first, name)) return static_cast<int>(i);
  }
  return -1;
}

// Each side's groups under construction and the aliases of tied weights.
struct Sides {
  std::vector<PendingGroup> muon, adamw;
  std::vector<std::pair<size_t, size_t>> aliases;  // (decision, decision of first name)
};

// Sorts the routed parameters into their side's groups (refusing a pattern
// group that gets none) and records the aliases.
Sides sort_by_side(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                   const MuonWithAdamWOptions& options, std::vector<RouteDecision>& routing) {
  // Default group of each side first, then its pattern groups.
  Sides sides;
  auto& muon_side = sides.muon;
  auto& adamw_side = sides.adamw;
  muon_side.resize(1 + options.muon_groups().size());
  adamw_side.resize(1 + options.adamw_groups().size());
  for (size_t i = 0; i < options.muon_groups().size(); ++i) {
    muon_side[i + 1].pattern = options.muon_groups()[i].first;
  }
  for (size_t i = 0; i < options.adamw_groups().size(); ++i) {
    adamw_side[i + 1].pattern = options.adamw_groups()[i].first;
  }
  // A tensor registered under two names (tied weights) is optimized once,
  // with the decision of its first name.
  std::unordered_map<const c10::TensorImpl*, size_t> first_name;
  auto& aliases = sides.aliases;
  size_t index = 0;
  for (const auto& item : named_parameters) {
    auto& d = routing[index];
    const auto [seen, fresh] = first_name.emplace(item.value().unsafeGetTensorImpl(), index);
    if (!fresh) {
      const auto& first = routing[seen->second];
      d.route = first.route;
      d.reason = "same tensor as '" + first.name + "'";
      aliases.emplace_back(index, seen->second);
      ++index;
      continue;
    }
    const bool to_muon = d.route == Route::kMuon;
    const int k = to_muon ? first_pattern(options.muon_groups(), d.name)
                          : first_pattern(options.adamw_groups(), d.name);
    auto& g = (to_muon ? muon_side : adamw_side)[static_cast<size_t>(k + 1)];
    g.params.push_back(item.value());
    g.names.push_back(d.name);
    g.decisions.push_back(index);
    ++index;
  }
  for (const auto* side : {&muon_side, &adamw_side}) {
    for (const auto& g : *side) {
      TORCH_CHECK_VALUE(g.pattern.empty() || !g.params.empty(), kWho, "the ",
                        side == &muon_side ? "muon_group" : "adamw_group", " pattern '", g.pattern,
                        "' matches no parameter routed to ",
                        side == &muon_side ? "Muon" : "AdamW", "; routing:\n",
                        format_routing(routing));
    }
  }
  return sides;
}

}  // namespace

torch::optim::AdamWOptions default_aux_adamw_options() {
  return AdamWOptions(3e-4).betas(std::make_tuple(0.9, 0.95)).eps(1e-8).weight_decay(0.0);
}

MuonWithAdamWOptions& MuonWithAdamWOptions::muon_group(const std::string& pattern,
                                                       MuonOptions options) {
  TORCH_CHECK_VALUE(!pattern.empty(), kWho, "muon_group pattern must not be empty");
  muon_groups_.emplace_back(pattern, std::move(options));
  return *this;
}

MuonWithAdamWOptions& MuonWithAdamWOptions::adamw_group(const std::string& pattern,
                                                        torch::optim::AdamWOptions options) {
  TORCH_CHECK_VALUE(!pattern.empty(), kWho, "adamw_group pattern must not be empty");
  adamw_groups_.emplace_back(pattern, std::move(options));
  return *this;
}

// What the constructor hands to the composite, computed before it is built.
struct MuonWithAdamW::Built {
  std::vector<CompositePart> parts;
  MuonOptions defaults;
  std::vector<RouteDecision> routing;
  size_t num_muon_groups = 0;
  Muon* muon = nullptr;
  AdamW* adamw = nullptr;
};

MuonWithAdamW::MuonWithAdamW(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                             MuonWithAdamWOptions options)
    : MuonWithAdamW(build(named_parameters, options)) {}

MuonWithAdamW::MuonWithAdamW(Built built)
    : CompositeOptimizer(std::move(built.parts), std::make_unique<MuonOptions>(built.defaults)),
      routing_(std::move(built.routing)),
      num_muon_groups_(built.num_muon_groups),
      muon_(built.muon),
      adamw_(built.adamw) {}

bool MuonWithAdamW::is_muon_group(size_t index) const {
  TORCH_CHECK_VALUE(index < param_groups_.size(), kWho, "group index ", index,
                    " out of range for ", param_groups_.size(), " groups");
  return index < num_muon_groups_;
}

std::string MuonWithAdamW::routing_table() const { return format_routing(routing_); }

// Routes the parameters and builds the Muon part (through
// options.muon_factory when set) and the AdamW part over their groups; a side
// without parameters gets no part.
MuonWithAdamW::Built MuonWithAdamW::build(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    const MuonWithAdamWOptions& options) {
  options.muon().validate();  // even when no parameter goes to Muon: a typo is a typo
  for (const auto& g : options.muon_groups()) g.second.validate();
  MuonWithAdamW::Built built;
  built.defaults = options.muon();
  auto& routing = built.routing;
  routing = route_parameters(named_parameters, options.routing());

  auto sides = sort_by_side(named_parameters, options, routing);
  auto& muon_side = sides.muon;
  auto& adamw_side = sides.adamw;
  const auto& aliases = sides.aliases;

  // The groups: Muon's, then AdamW's, leaving out empty ones.
  CompositePart muon_part;
  muon_part.name = "muon";
  CompositePart adamw_part;
  adamw_part.name = "adamw";
  std::vector<OptimizerParamGroup> muon_groups;
  std::vector<OptimizerParamGroup> adamw_groups;
  for (size_t i = 0; i < muon_side.size(); ++i) {
    auto& g = muon_side[i];
    if (g.params.empty()) continue;
    const auto& o = i == 0 ? options.muon() : options.muon_groups()[i - 1].second;
    for (const auto d : g.decisions) routing[d].group = static_cast<int64_t>(muon_groups.size());
    muon_groups.emplace_back(g.params, std::make_unique<MuonOptions>(o));
    muon_part.group_names.push_back(g.names);
  }
  built.num_muon_groups = muon_groups.size();
  for (size_t i = 0; i < adamw_side.size(); ++i) {
    auto& g = adamw_side[i];
    if (g.params.empty()) continue;
    const auto& o = i == 0 ? options.adamw() : options.adamw_groups()[i - 1].second;
    for (const auto d : g.decisions) {
      routing[d].group = static_cast<int64_t>(built.num_muon_groups + adamw_groups.size());
    }
    adamw_groups.emplace_back(g.params, std::make_unique<AdamWOptions>(o));
    adamw_part.group_names.push_back(g.names);
  }
  for (const auto& [alias, first] : aliases) routing[alias].group = routing[first].group;

  // The inner optimizers validate their options and parameters.
  if (!muon_groups.empty()) {
    std::unique_ptr<Muon> muon;
    if (options.muon_factory()) {
      muon = options.muon_factory()(muon_groups, options.muon());
      TORCH_CHECK_VALUE(muon != nullptr, kWho, "muon_factory returned a null optimizer");
    } else {
      muon = std::make_unique<Muon>(muon_groups, options.muon());
    }
    built.muon = muon.get();
    muon_part.optimizer = std::move(muon);
    built.parts.push_back(std::move(muon_part));
  }
  if (!adamw_groups.empty()) {
    auto adamw = std::make_unique<AdamW>(adamw_groups, options.adamw());
    compat::reapply_group_options(*adamw, adamw_groups);
    built.adamw = adamw.get();
    adamw_part.optimizer = std::move(adamw);
    built.parts.push_back(std::move(adamw_part));
  }
  return built;
}

}  // namespace muon
