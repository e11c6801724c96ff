// Simplified AdEMAMix: options and the update (the rest is muon::ElementwiseOptimizer).
#include "muon/optim/sim_ademamix.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "option_fields.h"
#include "util/scale.h"

namespace muon {
namespace {

// Steps until a decay b halves a value, less one, and its inverse (the
// half-life map of the warmup; 1e-8 keeps ln(b) finite at b = 0).
double half_life(const double beta) { return std::log(0.5) / std::log(beta + 1e-8) - 1; }
double beta_of_half_life(const double steps) { return std::pow(0.5, 1 / (steps + 1)); }

}  // namespace

double sim_ademamix_beta(const SimAdEMAMixOptions& o, const int64_t step) {
  const int64_t n = o.num_beta_fast_warmup_steps();
  if (n <= 0 || step >= n) return o.beta1();
  const double a = static_cast<double>(step) / static_cast<double>(n);
  return beta_of_half_life((1 - a) * half_life(o.min_beta_fast()) + a * half_life(o.beta1()));
}

void SimAdEMAMixOptions::validate() const { detail::check_listed_fields(*this, detail::who_of<SimAdEMAMix>()); }

// One step of Simplified AdEMAMix on `p` (the header's formula; the order
// and the operations of Emerging-Optimizers' TwoMomentsOptimizer.step and
// calculate_sim_ademamix_update).
void SimAdEMAMix::update(at::Tensor& p, const at::Tensor& grad, SimAdEMAMixParamState& st,
                         const SimAdEMAMixOptions& o) {
  st.step(st.step() + 1);
  const auto t = static_cast<double>(st.step());
  const double beta = sim_ademamix_beta(o, st.step());
  const auto g = detail::apply_weight_decay(p, grad, o.weight_decay_method(), o.lr(),
                                            o.weight_decay());
  auto& m = st.exp_avg();
  auto& v = st.exp_avg_sq();
  muon::detail::scale_(m, beta);
  m.add_(g);
  detail::accumulate_second_moment(v, g, o.beta2());
  const double bias1 = o.correct_bias() ? (1 - std::pow(beta, t)) / (1 - beta) : 1.0;
  const double bias2 = o.correct_bias() ? 1 - std::pow(o.beta2(), t) : 1.0;
  const auto denom = detail::second_moment_denominator(v, bias2, o.eps());
  const auto numer = (g * o.alpha()).add_(m / bias1);
  p.add_(numer.div_(denom), -o.lr());
}

MUON_INSTANTIATE_LISTED(ElementwiseOptimizer, SimAdEMAMix, SimAdEMAMixOptions, SimAdEMAMixParamState);

// Defaults are SimAdEMAMixOptions' own (Emerging-Optimizers'), lr aside (the common field).
void detail::register_sim_ademamix(OptimizerRegistry& registry) {
  registry.add(detail::hookable<SimAdEMAMixOptions>(
      detail::listed_entry<SimAdEMAMix>(
          detail::sim_ademamix_state(),
          "Simplified AdEMAMix (muon::SimAdEMAMix): a theory-style momentum plus alpha times the "
          "gradient, over Adam's second moment"),
      "decoupled"));
}

}  // namespace muon
