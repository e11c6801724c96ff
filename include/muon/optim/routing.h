#pragma once

/// Which optimizer updates which parameter: Muon for hidden weight matrices,
/// AdamW for everything else (embeddings, the output head, norms, biases,
/// scalars), decided from each parameter's name and shape.
///
/// Order of the decision for a parameter `name` with tensor `p`:
///   1. user overrides, in the order they were added: the first whose glob
///      pattern matches `name` decides;
///   2. p.dim() < 2 → AdamW;
///   3. `name` matches an embedding pattern → AdamW;
///   4. `name` matches an output-head pattern → AdamW;
///   5. otherwise → Muon.
/// Steps 2–4 are `default_routing_rules()`, the one list that the registry's
/// default override rules (muon/registry.h) follow as well.
/// Patterns are globs over the whole dotted name: `*` matches any run of
/// characters (dots included), `?` exactly one.
#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <string>
#include <vector>

#include "muon/enum_names.h"

namespace muon {

/// The optimizer a parameter goes to.
enum class Route { kMuon, kAdamW };

/// "muon" | "adamw".
MUON_ENUM_NAMES(Route, parse_route);

/// A default rule: parameters it matches go to AdamW (the scalar optimizer).
enum class DefaultRule {
  /// Fewer than two dimensions (biases, norm gains, scalars).
  kNdimBelow2,
  /// The name matches an embedding pattern.
  kEmbedding,
  /// The name matches an output-head pattern.
  kOutputHead,
};

/// "ndim < 2" | "embedding" | "output head": the start of the decision's reason.
std::string to_string(DefaultRule rule);

/// The default rules in the order they apply, after the user overrides; a
/// parameter that none matches goes to Muon.
const std::vector<DefaultRule>& default_routing_rules();

/// Whether glob `pattern` (`*` any run, `?` one character) matches all of `text`.
bool glob_match(const std::string& pattern, const std::string& text);

/// A user override: parameters whose name matches `pattern` go to `route`.
struct RoutingRule {
  /// Glob over the parameter's dotted name.
  std::string pattern;
  /// Where matching parameters go.
  Route route;
};

/// Where one parameter went, and why.
struct RouteDecision {
  /// The parameter's name (as in `Module::named_parameters()`).
  std::string name;
  /// Its shape.
  std::vector<int64_t> shape;
  /// The optimizer it goes to.
  Route route = Route::kMuon;
  /// Which rule decided: "override '<pattern>'", "ndim < 2",
  /// "embedding '<pattern>'", "output head '<pattern>'" or "matrix".
  std::string reason;
  /// Index of the parameter group holding it (set by the hybrid optimizer; -1 before).
  int64_t group = -1;
};

/// The routing rules: default embedding and output-head name patterns plus
/// user overrides, as chained setters.
class RoutingRules {
 public:
  /// Embedding patterns "*embed*", "wte.*", "*.wte.*", "wpe.*", "*.wpe.*";
  /// head patterns "lm_head.*", "*.lm_head.*", "output.*", "head.*",
  /// "classifier.*" (top-level `output`, `head` and `classifier` modules as in
  /// LLaMA, timm and torchvision; nested ones such as BERT's
  /// `layer.0.output.dense` are hidden matrices and stay with Muon).
  RoutingRules();

  /// Sends parameters whose name matches `pattern` to `route`, before every
  /// default rule; earlier overrides win over later ones.
  RoutingRules& add_override(const std::string& pattern, Route route);
  /// The same, with the route by name ("muon" | "adamw").
  RoutingRules& add_override(const std::string& pattern, const std::string& route);
  /// The overrides, in order.
  const std::vector<RoutingRule>& overrides() const { return overrides_; }

  /// Replaces the embedding name patterns.
  RoutingRules& embedding_patterns(std::vector<std::string> patterns);
  /// The embedding name patterns.
  const std::vector<std::string>& embedding_patterns() const { return embedding_patterns_; }
  /// Replaces the output-head name patterns.
  RoutingRules& head_patterns(std::vector<std::string> patterns);
  /// The output-head name patterns.
  const std::vector<std::string>& head_patterns() const { return head_patterns_; }

  /// The decision for one parameter. An override that sends a parameter with
  /// fewer than two dimensions to Muon raises c10::ValueError.
  RouteDecision route(const std::string& name, const at::Tensor& p) const;

 private:
  std::vector<RoutingRule> overrides_;
  std::vector<std::string> embedding_patterns_;
  std::vector<std::string> head_patterns_;
};

/// The decisions for every parameter of `named`, in its order.
std::vector<RouteDecision> route_parameters(const torch::OrderedDict<std::string, at::Tensor>& named,
                                            const RoutingRules& rules = {});

/// A table of the decisions, one line per parameter (name, shape, optimizer,
/// group, reason), for printing.
std::string format_routing(const std::vector<RouteDecision>& decisions);

}  // namespace muon
