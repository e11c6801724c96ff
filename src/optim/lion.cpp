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
void LionOptions::validate() const {
  const char* who = detail::who_of<Lion>();
  detail::check_non_negative(who, {{"lr", lr_}, {"weight_decay", weight_decay_}});
  detail::check_decay(who, {{"beta1", beta1_}, {"beta2", beta2_}});
}

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
  using O = LionOptions;
  using F = detail::OptionFields<O>;
  registry.add(detail::hookable<O>(detail::options_entry<Lion, O>(
      "lion", detail::lion_state(),
      "Lion (muon::Lion): sign of interpolated momentum, decoupled weight decay",
      {
          F::real("beta1", &O::beta1, 0.9, "interpolation weight of the momentum in the update",
                  0.0, 1.0)
              .exclusive_max(),
          F::real("beta2", &O::beta2, 0.99, "momentum decay", 0.0, 1.0).exclusive_max(),
          F::common("weight_decay", &O::weight_decay),
      }), "decoupled"));
}

}  // namespace muon
