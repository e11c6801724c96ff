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
void LaPropOptions::validate() const { detail::check_listed_fields(*this, detail::who_of<LaProp>()); }

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
  registry.add(detail::hookable<LaPropOptions>(
      detail::listed_entry<LaProp>(
          detail::laprop_state(),
          "LaProp (muon::LaProp): momentum of gradients normalized by the second moment, decoupled "
          "weight decay"),
      "decoupled"));
}

}  // namespace muon
