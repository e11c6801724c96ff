// muon::WholeMatrixOptimizer's members (muon/optim/whole_matrix.h), for the
// source files that instantiate it. Not installed.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "muon/compat.h"
#include "muon/optim/whole_matrix.h"
#include "optim/closure.h"
#include "optim/elementwise_optimizer.h"
#include "optim/step_transaction.h"

namespace muon {
namespace detail {

/// The gradient `grad` (the whole matrix) of `p` as an update under weight
/// decay `method` sees it: grad + wd·p under "l2" with wd != 0 (a new
/// tensor), else `grad` itself.
inline at::Tensor l2_gradient(const at::Tensor& p, const at::Tensor& grad, const std::string& method, double wd) {
  return wd != 0 && method == "l2" ? grad.add(p.detach().reshape(grad.sizes()), wd) : grad;
}

/// Weight decay by `method` as apply_weight_decay makes it ("decoupled" or
/// "independent"; under "l2" it entered the gradient, l2_gradient), then
/// p ← p − lr·u, `u` of p's numel.
inline void decay_and_update(at::Tensor& p, const at::Tensor& u, const std::string& method, double lr, double wd) {
  if (method != "l2") apply_weight_decay(p, p.grad(), method, lr, wd);
  p.detach().add_(u.view(p.sizes()), -lr);
}

/// One process's step of a whole-matrix optimizer `opt` (State its
/// per-parameter state, Options its group options): for each parameter p
/// with a gradient, `compute(p, state, options)` returns its update, a
/// c10::Error it raises becoming a c10::ValueError prefixed by `who` that
/// names p (name_step_failure); then `apply(p, update, options)`.
template <typename State, typename Options, typename Opt, typename Compute, typename Apply>
void step_each_parameter(Opt& opt, const char* who, const Compute& compute, const Apply& apply) {
  auto& states = opt.state();
  for (const auto g : c10::irange(opt.param_groups().size())) {
    auto& group = opt.param_groups()[g];
    const auto& o = static_cast<const Options&>(group.options());
    for (const auto i : c10::irange(group.params().size())) {
      auto& p = group.params()[i];
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<State>();
      at::Tensor u;
      name_step_failure(
          who, [&] { return describe_param(p, g, i); }, [&] { u = compute(p, static_cast<State&>(*slot), o); });
      apply(p, u, o);
    }
  }
}

}  // namespace detail

template <typename Derived, typename Options, typename State>
WholeMatrixOptimizer<Derived, Options, State>::WholeMatrixOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults, bool check)
    : ListedOptimizer<Derived, Options, State>(std::move(param_groups), defaults) {
  if (check) check_before_step();
}

template <typename Derived, typename Options, typename State>
WholeMatrixOptimizer<Derived, Options, State>::WholeMatrixOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults)
    : WholeMatrixOptimizer(std::move(param_groups), std::move(defaults), true) {}

template <typename Derived, typename Options, typename State>
WholeMatrixOptimizer<Derived, Options, State>::WholeMatrixOptimizer(std::vector<at::Tensor> params,
                                                                    Options defaults)
    : WholeMatrixOptimizer(
          std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
          std::move(defaults)) {}

template <typename Derived, typename Options, typename State>
void WholeMatrixOptimizer<Derived, Options, State>::check_before_step() {
  const char* who = detail::who_of<Derived>();
  detail::check_group_options<Options>(this->param_groups_, who, detail::options_name_of<Derived>());
  for (const auto g : c10::irange(this->param_groups_.size())) {
    for (const auto& p : this->param_groups_[g].params()) {
      if (Derived::kMinDims == 1) {
        TORCH_CHECK_VALUE(p.dim() >= 1, who, "parameter of group ", g, " is 0-d; ", Derived::kNames.kind,
                          " steps parameters with at least one dimension");
      }
      TORCH_CHECK_VALUE(p.dim() >= Derived::kMinDims, who, "parameter of group ", g, " has ", p.dim(), " dims; ",
                        Derived::kNames.kind, " steps matrices (give 0-d and 1-d parameters to another optimizer)");
    }
  }
}

template <typename Derived, typename Options, typename State>
std::pair<int64_t, int64_t> WholeMatrixOptimizer<Derived, Options, State>::whole_matrix_dims(
    const at::Tensor& param) const {
  return {param.size(0), param.numel() == 0 ? 0 : param.numel() / param.size(0)};
}

template <typename Derived, typename Options, typename State>
bool WholeMatrixOptimizer<Derived, Options, State>::holds_whole_state(const at::Tensor& /*param*/) const {
  return true;
}

}  // namespace muon
