// MOSO: options, the whole-matrix step, save/load and the registry entry.
#include "muon/optim/moso.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <tuple>
#include <utility>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "muon/compat.h"
#include "optim/closure.h"
#include "optim/eigenbasis.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "optim/step_transaction.h"
#include "optim/whole_matrix_optimizer.h"
#include "option_fields.h"
#include "util/names.h"

namespace muon {

MUON_INSTANTIATE_LISTED(WholeMatrixOptimizer, Moso, MosoOptions, MosoParamState);

namespace {

constexpr const char* kWho = "[muon::Moso] ";

}  // namespace

at::Tensor detail::moso_matrix_update(const at::Tensor& grad, MosoParamState& st, const MosoOptions& o) {
  const auto wide = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const bool left = grad.size(0) <= grad.size(1);
  const int64_t side = std::min(grad.size(0), grad.size(1));
  if (!st.momentum_buffer().defined()) {
    st.momentum_buffer(at::zeros(grad.sizes(), grad.options().dtype(wide)));
    st.exp_avg_sq(at::zeros(grad.sizes(), grad.options().dtype(wide)));
    st.M(at::zeros({side, side}, grad.options().dtype(wide)));
    st.Q_M(at::eye(side, grad.options().dtype(wide)));
  }
  const int64_t s = st.step();
  const double t = static_cast<double>(s + 1);
  auto& b = st.momentum_buffer();
  b.lerp_(grad.to(wide), 1 - o.momentum());

  // The covariance of B on its smaller side, its factor bias-corrected.
  const double shampoo_beta = 1 - (1 - o.shampoo_beta()) / (1 - std::pow(o.shampoo_beta(), t));
  const auto x = left ? b : b.t();
  st.M().lerp_(at::mm(x, x.t()), 1 - shampoo_beta);
  // A covariance beyond the range of its dtype has no eigenbasis: eigh fails
  // or returns NaN. Raised as c10::Error: the step names the parameter and
  // restores what it changed.
  TORCH_CHECK(all_finite(st.M()), "its covariance M (", st.M().scalar_type(),
              ") is not finite: momentum entries up to ", b.abs().max().item<double>(),
              " make B·Bᵀ larger than the dtype holds");
  st.Q_M(s == 0 ? detail::eigh_descending(st.M()).second
                : detail::orthogonal_iteration(st.M(), st.Q_M(), 1).second);

  // RMSprop in the eigenbasis, and back.
  const auto& q = st.Q_M();
  const auto projected = left ? at::mm(q.t(), b) : at::mm(b, q);
  auto& v = st.exp_avg_sq();
  v.lerp_(projected.square(), 1 - o.rms_beta());
  const auto rms_step = projected / (v.sqrt() + o.eps());
  auto update = (left ? at::mm(q, rms_step) : at::mm(rms_step, q.t())).to(grad.scalar_type());
  detail::clip_update_rms(update, o.max_update_rms());
  st.step(s + 1);
  return update;
}

// ---- MosoOptions ---------------------------------------------------------------

void MosoOptions::validate() const { detail::check_listed_fields(*this, kWho); }

// ---- Moso ----------------------------------------------------------------------

void Moso::step_parameters() {
  detail::step_each_parameter<MosoParamState, MosoOptions>(
      *this, kWho,
      [this](const at::Tensor& p, MosoParamState& st, const MosoOptions& o) {
        const auto [rows, cols] = whole_matrix_dims(p);
        return detail::moso_matrix_update(p.grad().reshape({rows, cols}), st, o);
      },
      [](at::Tensor& p, const at::Tensor& u, const MosoOptions& o) {
        detail::decay_and_update(p, u, "decoupled", o.lr(), o.weight_decay());
      });
}

// MOSO's entry (muon::Moso): defaults are Emerging-Optimizers', lr and
// weight_decay aside (the common fields). MOSO steps matrices: 1-D,
// embedding and head parameters go to scalar_optimizer.
void detail::register_moso(OptimizerRegistry& registry) {
  registry.add(detail::hookable<MosoOptions>(
      detail::listed_matrix_entry<Moso>(detail::moso_state(),
                                        "MOSO (muon::Moso): Muon's momentum preconditioned by RMSprop in the "
                                        "eigenbasis of its smaller side's covariance"),
      "decoupled"));
}

}  // namespace muon
