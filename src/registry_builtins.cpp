// The global registry and the built-ins' registration: each built-in entry
// (muon, adaptive_muon, adam, adamw, sgd, lion, laprop, signum, sim_ademamix,
// soap, kl_soap, kl_m_soap, rekls, tp_rekls, rekls_v3, stacked_soap, dion2, nordion2,
// dion, iso, oblique_sgd, oblique_adam, moso, psgd_pro, polargrad, scion, mop, spel,
// muon_hyperball) lives in its optimizer's source file
// (src/builtin_entries.h); register_builtins calls them explicitly, in the
// registry's order.
#include <string>
#include <vector>

#include "builtin_entries.h"
#include "muon/optim/routing.h"
#include "muon/registry.h"
#include "registry_internal.h"

namespace muon {
namespace detail {

std::vector<OverrideRule> scalar_defaults(const std::string& who) {
  std::vector<OverrideRule> rules;
  for (const auto rule : default_routing_rules()) {
    OverrideRule r;
    switch (rule) {
      case DefaultRule::kNdimBelow2:
        r.match_max_ndim(1);
        break;
      case DefaultRule::kEmbedding:
        r.match_embedding();
        break;
      case DefaultRule::kOutputHead:
        r.match_head();
        break;
    }
    rules.push_back(
        r.set("optimizer", "${scalar_optimizer}").named(who + " default: " + to_string(rule)));
  }
  return rules;
}

}  // namespace detail

OptimizerRegistry& OptimizerRegistry::global() {
  static OptimizerRegistry* registry = [] {
    auto* r = new OptimizerRegistry();  // never destroyed: usable from static destructors
    register_builtins(*r);
    detail::run_global_extensions(*r);
    return r;
  }();
  return *registry;
}

void OptimizerRegistry::register_builtins(OptimizerRegistry& registry) {
  detail::register_muon(registry);
  detail::register_adaptive_muon(registry);
  detail::register_torch_builtins(
      registry);  // adam (before adamw, which reads its fields), adamw, sgd
  detail::register_lion(registry);
  detail::register_laprop(registry);
  detail::register_signum(registry);
  detail::register_sim_ademamix(registry);
  detail::register_soap(registry);
  detail::register_kl_soap(registry);               // kl_soap, kl_m_soap, rekls, tp_rekls, rekls_v3, stacked_soap
  detail::register_dion2(registry);                  // dion2, nordion2
  detail::register_dion(registry);
  detail::register_iso(registry);
  detail::register_oblique(registry);                // oblique_sgd, oblique_adam
  detail::register_moso(registry);
  detail::register_psgd_pro(registry);
  detail::register_orthogonalized_family(registry);  // polargrad, scion, mop, spel, muon_hyperball
}

}  // namespace muon
