// The state schemas of the built-in optimizers (each optimizer's source
// file puts its own on its entry: src/builtin_entries.h).
#pragma once

#include <string>

#include "muon/optim/orthogonalized_family.h"
#include "muon/optim/state_schema.h"

namespace muon::detail {

StateSchema muon_state();
StateSchema adaptive_muon_state();
StateSchema adam_state();
StateSchema adamw_state();
StateSchema sgd_state();
StateSchema lion_state();
StateSchema laprop_state();
StateSchema oblique_sgd_state();
StateSchema oblique_adam_state();
StateSchema signum_state();
StateSchema sim_ademamix_state();
StateSchema soap_state();
/// Dion2's (nordion2 false) or NorDion2's (true).
StateSchema dion2_state(bool nordion2);
StateSchema dion_state();
StateSchema iso_state();
StateSchema moso_state();
/// PSGD-Pro's (muon::PsgdPro): step, exp_avg, Q_L, Q_R, lip_L, lip_R.
StateSchema psgd_pro_state();
/// The KL-SOAP family's entry `kind` (kl_soap, kl_m_soap, rekls, rekls_v3, stacked_soap).
StateSchema kl_soap_state(const std::string& kind);
/// The orthogonalized family's (polargrad, scion, mop, spel, muon_hyperball): Muon's.
StateSchema orthogonalized_state(OrthogonalizedKind kind);

}  // namespace muon::detail
