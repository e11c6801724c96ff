// The LaProp optimizer: options and the update (the rest is muon::ElementwiseOptimizer).
#include "muon/optim/laprop.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "option_fields.h"
#include "util/scale.h"

namespace muon {
void LaPropOptions::validate() const {
  const char* who = detail::who_of<LaProp>();
  detail::check_non_negative(who, {{"lr", lr_}, {"weight_decay", weight_decay_}});
  detail::check_decay(who, {{"beta1", beta1_}, {"beta2", beta2_}});
  detail::check_denominator_eps(who, eps_);
}

// One step of LaProp on `p` (the header's formula; the order and the
// operations of Emerging-Optimizers' LaProp and calculate_laprop_update).
void LaProp::update(at::Tensor& p, const at::Tensor& grad, LaPropParamState& st,
                   const LaPropOptions& o) {
  st.step(st.step() + 1);
  const auto t = static_cast<double>(st.step());
  const double bias1 = o.correct_bias() ? 1 - std::pow(o.beta1(), t) : 1.0;
  const double bias2 = o.correct_bias() ? 1 - std::pow(o.beta2(), t) : 1.0;
  if (o.weight_decay() != 0) muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
  auto& m = st.exp_avg();
  auto& v = st.exp_avg_sq();
  detail::accumulate_second_moment(v, grad, o.beta2());
  const auto denom = detail::second_moment_denominator(v, bias2, o.eps());
  m.lerp_(grad / denom, 1 - o.beta1());
  p.add_(m / bias1, -o.lr());
}

MUON_INSTANTIATE_LISTED(ElementwiseOptimizer, LaProp, LaPropOptions, LaPropParamState);

// Defaults are LaPropOptions' own (Emerging-Optimizers'), lr aside (the common field).
void detail::register_laprop(OptimizerRegistry& registry) {
  using O = LaPropOptions;
  using F = detail::OptionFields<O>;
  registry.add(detail::hookable<O>(
      detail::options_entry<LaProp, O>(
          "laprop", detail::laprop_state(),
          "LaProp (muon::LaProp): momentum of gradients normalized by the second moment, decoupled "
          "weight decay",
          {
              F::real("beta1", &O::beta1, "decay of the momentum of normalized gradients", 0.0, 1.0).exclusive_max(),
              F::real("beta2", &O::beta2, "second-moment decay", 0.0, 1.0).exclusive_max(),
              F::real("eps", &O::eps, "added to the square root of the second moment", 0.0).exclusive_min(),
              F::common("weight_decay", &O::weight_decay),
              F::boolean("correct_bias", &O::correct_bias, "Adam-style bias correction of both moments"),
          }),
      "decoupled"));
}

}  // namespace muon
