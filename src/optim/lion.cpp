// The Lion optimizer: options and the update (the rest is muon::ElementwiseOptimizer).
#include "muon/optim/lion.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "option_fields.h"
#include "util/scale.h"

namespace muon {
void LionOptions::validate() const { detail::check_listed_fields(*this, detail::who_of<Lion>()); }

MUON_INSTANTIATE_LISTED(ElementwiseOptimizer, Lion, LionOptions, LionParamState);

void Lion::update(at::Tensor& p, const at::Tensor& grad, LionParamState& st, const LionOptions& o) {
  st.step(st.step() + 1);
  auto& m = st.exp_avg();
  // u = sign(β1·m + (1 − β1)·g) = sign(m.lerp(g, 1 − β1)); m is read before it is updated.
  const auto u = m.lerp(grad, 1 - o.beta1()).sign_();
  if (o.weight_decay() != 0) muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
  p.add_(u, -o.lr());
  m.lerp_(grad, 1 - o.beta2());
}

void detail::register_lion(OptimizerRegistry& registry) {
  registry.add(detail::hookable<LionOptions>(
      detail::listed_entry<Lion>(detail::lion_state(),
                                 "Lion (muon::Lion): sign of interpolated momentum, decoupled weight decay"),
      "decoupled"));
}

}  // namespace muon
