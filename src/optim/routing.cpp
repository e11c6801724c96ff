// Routing of named parameters between Muon and AdamW.
#include "muon/optim/routing.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

#include "util/names.h"

namespace muon {
namespace {

constexpr const char* kWho = "[muon::RoutingRules] ";

const std::string* first_match(const std::vector<std::string>& patterns, const std::string& name) {
  for (const auto& pattern : patterns) {
    if (glob_match(pattern, name)) return &pattern;
  }
  return nullptr;
}

constexpr detail::EnumName<Route> kRoutes[] = {{Route::kMuon, "muon"}, {Route::kAdamW, "adamw"}};
constexpr detail::EnumName<DefaultRule> kDefaultRules[] = {{DefaultRule::kNdimBelow2, "ndim < 2"},
                                                           {DefaultRule::kEmbedding, "embedding"},
                                                           {DefaultRule::kOutputHead, "output head"}};

}  // namespace

MUON_DEFINE_ENUM_NAMES(Route, parse_route, kRoutes, kWho, "route");

std::string to_string(DefaultRule rule) { return detail::name_of(rule, kDefaultRules); }

const std::vector<DefaultRule>& default_routing_rules() {
  static const std::vector<DefaultRule> rules{DefaultRule::kNdimBelow2, DefaultRule::kEmbedding,
                                              DefaultRule::kOutputHead};
  return rules;
}

bool glob_match(const std::string& pattern, const std::string& text) {
  // Iterative matcher with single-star backtracking: O(|pattern|·|text|).
  size_t p = 0;
  size_t t = 0;
  size_t star = std::string::npos;
  size_t resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

RoutingRules::RoutingRules()
    : embedding_patterns_{"*embed*", "wte.*", "*.wte.*", "wpe.*", "*.wpe.*"},
      head_patterns_{"lm_head.*", "*.lm_head.*", "output.*", "head.*", "classifier.*"} {}

RoutingRules& RoutingRules::add_override(const std::string& pattern, Route route) {
  TORCH_CHECK_VALUE(!pattern.empty(), kWho, "override pattern must not be empty");
  overrides_.push_back({pattern, route});
  return *this;
}

RoutingRules& RoutingRules::add_override(const std::string& pattern, const std::string& route) {
  return add_override(pattern, parse_route(route));
}

RoutingRules& RoutingRules::embedding_patterns(std::vector<std::string> patterns) {
  embedding_patterns_ = std::move(patterns);
  return *this;
}

RoutingRules& RoutingRules::head_patterns(std::vector<std::string> patterns) {
  head_patterns_ = std::move(patterns);
  return *this;
}

RouteDecision RoutingRules::route(const std::string& name, const at::Tensor& p) const {
  TORCH_CHECK_VALUE(p.defined(), kWho, "parameter '", name, "' is undefined");
  RouteDecision d;
  d.name = name;
  d.shape = p.sizes().vec();
  for (const auto& rule : overrides_) {
    if (!glob_match(rule.pattern, name)) continue;
    TORCH_CHECK_VALUE(rule.route != Route::kMuon || p.dim() >= 2, kWho, "override '",
                      rule.pattern, "' sends '", name, "' (shape ", detail::shape_text(d.shape),
                      ") to Muon, which needs ndim >= 2");
    d.route = rule.route;
    d.reason = "override '" + rule.pattern + "'";
    return d;
  }
  for (const auto rule : default_routing_rules()) {
    const std::string* pattern = nullptr;
    switch (rule) {
      case DefaultRule::kNdimBelow2:
        if (p.dim() >= 2) continue;
        break;
      case DefaultRule::kEmbedding:
        if ((pattern = first_match(embedding_patterns_, name)) == nullptr) continue;
        break;
      case DefaultRule::kOutputHead:
        if ((pattern = first_match(head_patterns_, name)) == nullptr) continue;
        break;
    }
    d.route = Route::kAdamW;
    d.reason = to_string(rule) + (pattern != nullptr ? " '" + *pattern + "'" : std::string());
    return d;
  }
  d.route = Route::kMuon;
  d.reason = "matrix";
  return d;
}

std::vector<RouteDecision> route_parameters(const torch::OrderedDict<std::string, at::Tensor>& named,
                                            const RoutingRules& rules) {
  std::vector<RouteDecision> out;
  out.reserve(named.size());
  for (const auto& item : named) out.push_back(rules.route(item.key(), item.value()));
  return out;
}

std::string format_routing(const std::vector<RouteDecision>& decisions) {
  size_t name_w = 9;  // "parameter"
  size_t shape_w = 5;
  for (const auto& d : decisions) {
    name_w = std::max(name_w, d.name.size());
    shape_w = std::max(shape_w, detail::shape_text(d.shape).size());
  }
  std::ostringstream out;
  auto pad = [&](const std::string& s, size_t w) { out << s << std::string(w - s.size() + 2, ' '); };
  pad("parameter", name_w);
  pad("shape", shape_w);
  pad("optimizer", 9);
  pad("group", 5);
  out << "reason\n";
  for (const auto& d : decisions) {
    pad(d.name, name_w);
    pad(detail::shape_text(d.shape), shape_w);
    pad(to_string(d.route), 9);
    pad(d.group < 0 ? std::string("-") : std::to_string(d.group), 5);
    out << d.reason << '\n';
  }
  return out.str();
}

}  // namespace muon
