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

void SimAdEMAMixOptions::validate() const {
  const char* who = detail::who_of<SimAdEMAMix>();
  detail::check_non_negative(who, {{"lr", lr_}, {"weight_decay", weight_decay_}});
  detail::check_decay(who, {{"beta1", beta1_}, {"beta2", beta2_}, {"min_beta_fast", min_beta_fast_}});
  detail::check_denominator_eps(who, eps_);
  detail::check_weight_decay_method(who, weight_decay_method_);
  TORCH_CHECK_VALUE(num_beta_fast_warmup_steps_ >= 0, who,
                    "num_beta_fast_warmup_steps must be >= 0 (0: no warmup), got ", num_beta_fast_warmup_steps_);
  TORCH_CHECK_VALUE(std::isfinite(alpha_), who, "alpha must be finite, got ", alpha_);
}

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
  using O = SimAdEMAMixOptions;
  using F = detail::OptionFields<O>;
  registry.add(detail::hookable<O>(
      detail::options_entry<SimAdEMAMix, O>(
          "sim_ademamix", detail::sim_ademamix_state(),
          "Simplified AdEMAMix (muon::SimAdEMAMix): a theory-style momentum plus alpha times the "
          "gradient, over Adam's second moment",
          {
              F::real("beta1", &O::beta1, "momentum decay (final value of the warmup)", 0.0, 1.0).exclusive_max(),
              F::real("beta2", &O::beta2, "second-moment decay", 0.0, 1.0).exclusive_max(),
              F::real("eps", &O::eps, "added to the square root of the second moment", 0.0).exclusive_min(),
              F::boolean("correct_bias", &O::correct_bias, "bias correction of both moments"),
              F::integer("num_beta_fast_warmup_steps", &O::num_beta_fast_warmup_steps,
                         "steps of the half-life warmup of beta1 from min_beta_fast (0: none)", 0.0),
              F::real("min_beta_fast", &O::min_beta_fast, "momentum decay at the start of the warmup", 0.0, 1.0)
                  .exclusive_max(),
              F::real("alpha", &O::alpha, "weight of the current gradient in the update"),
              F::common("weight_decay", &O::weight_decay),
              F::text("weight_decay_method", &O::weight_decay_method, "how weight decay enters the step",
                      detail::weight_decay_method_names()),
          }),
      "decoupled"));
}

}  // namespace muon
