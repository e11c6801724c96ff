// ObliqueSGD and ObliqueAdam: options, the `dim` check and the updates (the
// rest is muon::ElementwiseOptimizer).
#include "muon/optim/oblique.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <cmath>
#include <utility>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "option_fields.h"

namespace muon {
namespace {

// Raises c10::ValueError unless every parameter of every group of `opt` has
// at least one dimension and the group's `dim` names one of them.
template <typename Opt>
void check_dims(const Opt& opt) {
  using Options = typename Opt::OptionsType;
  const char* who = detail::who_of<Opt>();
  const auto& groups = opt.param_groups();
  for (const auto i : c10::irange(groups.size())) {
    const auto dim = static_cast<const Options&>(groups[i].options()).dim();
    for (const auto& p : groups[i].params()) {
      const int64_t n = p.dim();
      TORCH_CHECK_VALUE(n >= 1, who, "parameters must have at least one dimension, got a 0-d "
                                     "parameter in param group ", i);
      TORCH_CHECK_VALUE(dim >= -n && dim < n, who, "dim must be in [", -n, ", ", n,
                        ") for a parameter of shape ", p.sizes(), " (param group ", i, "), got ",
                        dim);
    }
  }
}

// r = u − p·⟨p, u⟩_dim, weight decay on (p, r), p ← p − lr·r, then p's slices
// along `dim` scaled to unit norm: Emerging-Optimizers' _compute_riemannian_grad,
// _apply_weight_decay_inplace, add_ and torch.nn.functional.normalize, in order.
void project_step_retract(at::Tensor& p, const at::Tensor& u, const std::string& method, double lr,
                          double wd, int64_t dim, double eps) {
  const auto inner = (p * u).sum(dim, /*keepdim=*/true);
  auto r = u - p * inner;
  r = detail::apply_weight_decay(p, r, method, lr, wd);
  p.add_(r, -lr);
  const auto norm = p.norm(2, dim, /*keepdim=*/true).clamp_min_(eps);
  p.div_(norm);
}

}  // namespace

void ObliqueSGDOptions::validate() const { detail::check_listed_fields(*this, detail::who_of<ObliqueSGD>()); }

void ObliqueAdamOptions::validate() const { detail::check_listed_fields(*this, detail::who_of<ObliqueAdam>()); }

void ObliqueSGD::check_before_step() {
  ElementwiseOptimizer::check_before_step();
  check_dims(*this);
}

void ObliqueAdam::check_before_step() {
  ElementwiseOptimizer::check_before_step();
  check_dims(*this);
}

void ObliqueSGD::update(at::Tensor& p, const at::Tensor& grad, ObliqueSGDParamState& st,
                        const ObliqueSGDOptions& o) {
  st.step(st.step() + 1);
  auto& u = st.momentum_buffer();
  u.mul_(o.momentum()).add_(grad);
  project_step_retract(p, u, o.weight_decay_method(), o.lr(), o.weight_decay(), o.dim(), o.eps());
}

// √v is divided by c2, not √c2: Emerging-Optimizers' ObliqueAdam.
void ObliqueAdam::update(at::Tensor& p, const at::Tensor& grad, ObliqueAdamParamState& st,
                         const ObliqueAdamOptions& o) {
  st.step(st.step() + 1);
  const auto t = static_cast<double>(st.step());
  auto& m = st.exp_avg();
  auto& v = st.exp_avg_sq();
  m.mul_(o.beta1()).add_(grad, 1 - o.beta1());
  v.mul_(o.beta2()).addcmul_(grad, grad, 1 - o.beta2());
  const double c1 = o.correct_bias() ? 1 - std::pow(o.beta1(), t) : 1.0;
  const double c2 = o.correct_bias() ? 1 - std::pow(o.beta2(), t) : 1.0;
  const auto u = (m / c1).div_(v.sqrt().div_(c2).add_(o.eps()));
  project_step_retract(p, u, o.weight_decay_method(), o.lr(), o.weight_decay(), o.dim(), o.eps());
}

MUON_INSTANTIATE_LISTED(ElementwiseOptimizer, ObliqueSGD, ObliqueSGDOptions, ObliqueSGDParamState);
MUON_INSTANTIATE_LISTED(ElementwiseOptimizer, ObliqueAdam, ObliqueAdamOptions, ObliqueAdamParamState);

// Defaults are the options' own (Emerging-Optimizers'), lr aside (the common
// field). Emerging-Optimizers steps matrices with these: 1-D, embedding and
// head parameters go to scalar_optimizer, as Iso's and Dion's entries send them.
void detail::register_oblique(OptimizerRegistry& registry) {
  const char* why = "it renormalizes slices of the weight after its update";
  registry.add(detail::not_hookable(
      detail::listed_matrix_entry<ObliqueSGD>(
          detail::oblique_sgd_state(),
          "ObliqueSGD (muon::ObliqueSGD): Riemannian SGD with momentum on unit-norm slices along dim"),
      why));
  registry.add(
      detail::not_hookable(detail::listed_matrix_entry<ObliqueAdam>(
                               detail::oblique_adam_state(),
                               "ObliqueAdam (muon::ObliqueAdam): Riemannian Adam on unit-norm slices along dim"),
                           why));
}

}  // namespace muon
