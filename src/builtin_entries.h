// The built-in registry entries, each registered by a function of its
// optimizer's own source file (the optimizer, its options and its entry
// together). OptimizerRegistry::register_builtins (src/registry_builtins.cpp)
// calls them in the registry's order: explicit calls, so that a static
// libmuon keeps every entry (no static initializer a linker could drop).
// Not installed.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "muon/optim/muon.h"
#include "muon/registry.h"
#include "option_fields.h"

namespace muon::detail {

/// muon (src/optim/muon.cpp).
void register_muon(OptimizerRegistry& registry);
/// adaptive_muon (src/optim/adaptive_muon.cpp).
void register_adaptive_muon(OptimizerRegistry& registry);
/// adam, adamw and sgd: LibTorch's own (src/optim/torch_builtins.cpp).
void register_torch_builtins(OptimizerRegistry& registry);
/// lion (src/optim/lion.cpp).
void register_lion(OptimizerRegistry& registry);
/// laprop (src/optim/laprop.cpp).
void register_laprop(OptimizerRegistry& registry);
/// signum (src/optim/signum.cpp).
void register_signum(OptimizerRegistry& registry);
/// sim_ademamix (src/optim/sim_ademamix.cpp).
void register_sim_ademamix(OptimizerRegistry& registry);
/// oblique_sgd, then oblique_adam (src/optim/oblique.cpp).
void register_oblique(OptimizerRegistry& registry);
/// soap (src/optim/soap.cpp).
void register_soap(OptimizerRegistry& registry);
/// dion2, then nordion2 (src/optim/dion2.cpp).
void register_dion2(OptimizerRegistry& registry);
/// dion (src/optim/dion.cpp).
void register_dion(OptimizerRegistry& registry);
/// iso (src/optim/iso.cpp).
void register_iso(OptimizerRegistry& registry);
/// kl_soap, kl_m_soap, rekls, tp_rekls, rekls_v3, stacked_soap (src/optim/kl_soap.cpp).
void register_kl_soap(OptimizerRegistry& registry);
/// moso (src/optim/moso.cpp).
void register_moso(OptimizerRegistry& registry);
/// psgd_pro (src/optim/psgd_pro.cpp).
void register_psgd_pro(OptimizerRegistry& registry);
/// polargrad, scion, mop, spel, then muon_hyperball (src/optim/orthogonalized_family.cpp).
void register_orthogonalized_family(OptimizerRegistry& registry);

/// A group's MuonOptions from the muon_* fields (muon's make_options; the
/// entries that read muon's fields use it too). src/optim/muon.cpp.
MuonOptions muon_options_from(const OptimizerSettings& settings);

/// The hybrid's routing rules (muon::default_routing_rules), as config rules
/// that send those parameters to the scalar optimizer; `who` names them.
/// src/registry_builtins.cpp.
std::vector<OverrideRule> scalar_defaults(const std::string& who);

/// The entry of an optimizer of matrices (dion, iso, moso, psgd_pro, soap):
/// options_entry, its doc followed by "; 1-D, embedding and head parameters
/// go to scalar_optimizer", and scalar_defaults(name) as its default
/// routing rules, which send those parameters there.
template <class Opt, class Options>
OptimizerEntry matrix_entry(const std::string& name, StateSchema state, const std::string& doc,
                            std::vector<OptionField<Options>> fields) {
  auto e = options_entry<Opt, Options>(
      name, std::move(state), doc + "; 1-D, embedding and head parameters go to scalar_optimizer", std::move(fields));
  e.default_overrides = scalar_defaults(name);
  return e;
}

/// The entry of Opt, a muon::ListedOptimizer whose options are written with
/// MUON_OPTIONS, under its prefix (Opt::kNames): options_entry with the
/// fields of the options' own description (listed_option_fields).
template <class Opt>
OptimizerEntry listed_entry(StateSchema state, const std::string& doc) {
  using Options = typename Opt::OptionsType;
  return options_entry<Opt, Options>(Opt::kNames.prefix, std::move(state), doc, listed_option_fields<Options>());
}

/// listed_entry as matrix_entry makes it: the scalar parameters routed to scalar_optimizer.
template <class Opt>
OptimizerEntry listed_matrix_entry(StateSchema state, const std::string& doc) {
  using Options = typename Opt::OptionsType;
  return matrix_entry<Opt, Options>(Opt::kNames.prefix, std::move(state), doc, listed_option_fields<Options>());
}

}  // namespace muon::detail
