// Iso: options, the whole-matrix step, save/load and the registry entry.
#include "muon/optim/iso.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <array>
#include <cmath>
#include <memory>
#include <tuple>
#include <utility>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "muon/compat.h"
#include "optim/closure.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "optim/step_transaction.h"
#include "optim/whole_matrix_optimizer.h"
#include "option_fields.h"
#include "util/fault_injection.h"
#include "util/names.h"

namespace muon {

MUON_INSTANTIATE_LISTED(WholeMatrixOptimizer, Iso, IsoOptions, IsoParamState);

namespace {

constexpr const char* kWho = "[muon::Iso] ";

// Y − lr·M retracted onto the Stiefel manifold (the top of muon/optim/iso.h).
at::Tensor retract(const at::Tensor& y, const at::Tensor& m, double lr, const std::string& how) {
  if (how == "cayley") {
    const auto d = -m;
    const auto skew = at::matmul(d, y.t()) - at::matmul(y, d.t());
    const auto eye = at::eye(y.size(0), y.options());
    return at::linalg_solve(eye - 0.5 * lr * skew, at::matmul(eye + 0.5 * lr * skew, y));
  }
  const auto z = y - lr * m;
  if (how == "polar") {
    const auto [u, s, vh] = at::linalg_svd(z, /*full_matrices=*/false);
    return at::matmul(u, vh);
  }
  const auto [q, r] = at::linalg_qr(z);
  auto signs = r.diagonal().sign();
  signs.masked_fill_(signs.eq(0), 1);
  return q * signs;
}

}  // namespace

at::Tensor detail::iso_matrix_update(const at::Tensor& param, const at::Tensor& grad, IsoParamState& st,
                                     const IsoOptions& o) {
  fault_point("Iso's retraction");
  const auto dtype = param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (!st.u().defined()) {
    const auto [u, s, vh] = at::linalg_svd(param.to(dtype), /*full_matrices=*/false);
    st.u(u.contiguous());
    st.sigma(s.contiguous());
    st.v(vh.t().contiguous());
    st.momentum_u(at::zeros_like(st.u()));
    st.momentum_v(at::zeros_like(st.v()));
  }
  st.step(st.step() + 1);
  const auto g = grad.to(dtype);
  const auto sigma = st.sigma().unsqueeze(0);
  st.momentum_u().mul_(o.momentum()).add_(at::matmul(g, st.v()) * sigma);
  st.momentum_v().mul_(o.momentum()).add_(at::matmul(g.t(), st.u()) * sigma);
  st.u(retract(st.u(), st.momentum_u(), o.lr(), o.retraction()).contiguous());
  st.v(retract(st.v(), st.momentum_v(), o.lr(), o.retraction()).contiguous());
  return at::matmul(st.u() * sigma, st.v().t()).to(grad.scalar_type());
}

// ---- IsoOptions ----------------------------------------------------------------

void IsoOptions::validate() const {
  detail::check_listed_fields(*this, kWho);
  TORCH_CHECK_VALUE(weight_decay_ == 0, kWho, "weight_decay must be 0 (Iso keeps the singular values and has no ",
                    "weight decay), got ", weight_decay_);
}

// ---- Iso -----------------------------------------------------------------------

void Iso::step_parameters() {
  detail::step_each_parameter<IsoParamState, IsoOptions>(
      *this, kWho,
      [this](const at::Tensor& p, IsoParamState& st, const IsoOptions& o) {
        const auto [rows, cols] = whole_matrix_dims(p);
        return detail::iso_matrix_update(p.detach().reshape({rows, cols}), p.grad().reshape({rows, cols}), st, o);
      },
      [](at::Tensor& p, const at::Tensor& x, const IsoOptions&) { p.detach().copy_(x.view(p.sizes())); });
}

// Iso's entry (muon::Iso): defaults are Emerging-Optimizers', lr aside (the
// common field); weight_decay must stay 0. Iso steps matrices: 1-D,
// embedding and head parameters go to scalar_optimizer.
void detail::register_iso(OptimizerRegistry& registry) {
  registry.add(detail::not_hookable(
      detail::listed_matrix_entry<Iso>(detail::iso_state(),
                                       "Iso (muon::Iso): the Stiefel factors of each matrix's SVD moved by heavy-ball "
                                       "momentum and retracted, the singular values fixed"),
      "it rebuilds the weight from its factors U·diag(σ)·Vᵀ rather than adding an update"));
}

}  // namespace muon
