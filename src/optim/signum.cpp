// The Signum optimizer: options and the update (the rest is muon::ElementwiseOptimizer).
#include "muon/optim/signum.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "option_fields.h"

namespace muon {
void SignumOptions::validate() const { detail::check_listed_fields(*this, detail::who_of<Signum>()); }

// One step of Signum on `p` (the header's formula; the order and the
// operations of Emerging-Optimizers' SingleMomentumOptimizer.step and
// calculate_signum_update: decay, then the momentum, then its sign).
void Signum::update(at::Tensor& p, const at::Tensor& grad, SignumParamState& st,
                   const SignumOptions& o) {
  st.step(st.step() + 1);
  const auto t = static_cast<double>(st.step());
  const double beta = o.momentum();
  const auto g = detail::apply_weight_decay(p, grad, o.weight_decay_method(), o.lr(),
                                            o.weight_decay());
  auto& m = st.exp_avg();
  m.lerp_(g, 1 - beta);
  const double bias = o.correct_bias() ? 1 - std::pow(beta, t) : 1.0;
  if (o.nesterov()) {
    const double bias_next = o.correct_bias() ? 1 - std::pow(beta, t + 1) : 1.0;
    const auto u = (m * beta).div_(bias_next).add_(g * (1 - beta) / bias);
    p.add_(u.sign_(), -o.lr());
  } else {
    // m / (1 − β^t) has the sign of m: the divisor is positive.
    p.add_(m.sign(), -o.lr());
  }
}

MUON_INSTANTIATE_LISTED(ElementwiseOptimizer, Signum, SignumOptions, SignumParamState);

// Defaults are SignumOptions' own (Emerging-Optimizers'), lr aside (the common field).
void detail::register_signum(OptimizerRegistry& registry) {
  registry.add(detail::hookable<SignumOptions>(
      detail::listed_entry<Signum>(detail::signum_state(),
                                   "Signum (muon::Signum): the sign of a momentum, optionally Nesterov"),
      "decoupled"));
}

}  // namespace muon
