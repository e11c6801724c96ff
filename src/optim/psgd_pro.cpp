// PSGD-Pro: options, the whole-matrix step, save/load and the registry entry
// (muon/optim/psgd_pro.h).
#include "muon/optim/psgd_pro.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <memory>
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
#include "util/seed.h"

namespace muon {

MUON_INSTANTIATE_LISTED(WholeMatrixOptimizer, PsgdPro, PsgdProOptions, PsgdProParamState);

namespace {

constexpr const char* kWho = "[muon::PsgdPro] ";
// The bound's subspace: 32 vectors, 2 half-iterations (psgd_utils.py's defaults).
constexpr int64_t kBoundVectors = 32;
constexpr int kBoundHalfIters = 2;
constexpr double kBoundEps = 1e-8;
constexpr double kProcrustesMaxStep = 0.125;

// N(0, 1) entries of `sizes` from `gen`, in `like`'s dtype, on its device.
at::Tensor randn(at::IntArrayRef sizes, at::Generator& gen, const at::Tensor& like) {
  return at::randn(sizes, gen, at::TensorOptions().dtype(like.scalar_type())).to(like.device());
}

// A lower bound of the spectral norm of `a` (already scaled): 32 random
// vectors turned towards a's largest row, two half-iterations of V ← V·A,
// rows normalized between them; the largest row norm.
at::Tensor subspace_bound(const at::Tensor& a, at::Generator& gen) {
  auto v = randn({kBoundVectors, a.size(1)}, gen, a);
  const auto row = a[at::argmax(at::linalg_vector_norm(a, 2, {1}))];
  v = row + at::sign((row * v).sum(1, /*keepdim=*/true)) * v;
  for (int i = 0; i < kBoundHalfIters; ++i) {
    v = at::mm(v, a);
    v = v / (at::linalg_vector_norm(v, 2, {1}, /*keepdim=*/true) + kBoundEps);
    v = at::mm(v, a);
  }
  return at::linalg_vector_norm(v, 2, {1}).amax();
}

// bound(C) of a symmetric positive semi-definite C: scaled by its largest diagonal entry.
at::Tensor spd_bound(const at::Tensor& c, at::Generator& gen) {
  const auto scale = c.diagonal().amax().clamp_min(kBoundEps);
  return scale * subspace_bound(c / scale, gen);
}

// One Procrustes step on Q (see the top of muon/optim/psgd_pro.h).
at::Tensor procrustes_step(const at::Tensor& q, at::Generator& gen) {
  auto r = q.t() - q;
  const auto scale = r.abs().amax().clamp_min(kBoundEps);
  r = r / (scale * subspace_bound(r / scale, gen)).clamp_min(kBoundEps);
  const auto rq = at::mm(r, q);
  const auto rrq = at::mm(r, rq);
  const double tr_rq = rq.trace().item<double>();
  const double tr_rrq = rrq.trace().item<double>();
  const double a = tr_rrq < 0 ? std::clamp(-tr_rq / tr_rrq, 0.0, kProcrustesMaxStep) : kProcrustesMaxStep;
  return q + a * (rq + (0.5 * a) * rrq);
}

// Q_Lᵀ·Q_L·X·Q_Rᵀ·Q_R.
at::Tensor precondition(const PsgdProParamState& st, const at::Tensor& x) {
  return at::mm(at::mm(st.Q_L().t(), at::mm(at::mm(st.Q_L(), x), st.Q_R().t())), st.Q_R());
}

// One side's factor and Lipschitz constant fitted to the covariance `cov`.
void fit_side(at::Tensor& q, at::Tensor& lip, const at::Tensor& cov, double numel, double eta, double beta,
              at::Generator& gen) {
  const double c = numel / static_cast<double>(q.size(0));
  const auto b = spd_bound(cov, gen) + c;
  lip = at::maximum(beta * lip + (1 - beta) * b, b);
  q = q - (eta / lip) * (at::mm(cov, q) - c * q);
  q = procrustes_step(q, gen);
}

}  // namespace

uint64_t detail::psgd_pro_seed(const PsgdProOptions& o, int64_t rows, int64_t cols, int64_t step) {
  return shape_draw_seed(o.seed(), rows, cols, static_cast<uint64_t>(step));
}

at::Tensor detail::psgd_pro_update(const at::Tensor& grad, PsgdProParamState& st, const PsgdProOptions& o) {
  const auto wide = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t m = grad.size(0), n = grad.size(1);
  const auto options = grad.options().dtype(wide);
  if (!st.exp_avg().defined()) {
    st.exp_avg(at::zeros({m, n}, options));
    st.Q_L(at::eye(m, options) * o.precond_init_scale());
    st.Q_R(at::eye(n, options) * o.precond_init_scale());
    st.lip_L(at::ones({}, options));
    st.lip_R(at::ones({}, options));
  }
  const int64_t s = st.step();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(psgd_pro_seed(o, m, n, s));
  auto& ema = st.exp_avg();
  ema.lerp_(grad.to(wide), 1 - o.momentum());
  const double eta = std::max(o.precond_lr() / std::sqrt(1.0 + static_cast<double>(s) /
                                                                   static_cast<double>(o.warmup_steps())),
                              o.min_precond_lr());

  // The factors fitted to the noisy momentum's preconditioned covariances.
  const auto damped = ema + (o.damping_noise_scale() + 1e-7 * ema.abs()) * randn({m, n}, gen, ema);
  const auto pg = precondition(st, damped);
  const double numel = static_cast<double>(m * n);
  auto q_l = st.Q_L(), q_r = st.Q_R(), lip_l = st.lip_L(), lip_r = st.lip_R();
  fit_side(q_l, lip_l, at::mm(pg, pg.t()), numel, eta, o.beta_lip(), gen);
  fit_side(q_r, lip_r, at::mm(pg.t(), pg), numel, eta, o.beta_lip(), gen);
  // Both factors' largest |entry| at their geometric mean.
  const auto norm_l = q_l.abs().amax(), norm_r = q_r.abs().amax();
  const auto mean = (norm_l * norm_r).sqrt();
  TORCH_CHECK(all_finite(q_l) && all_finite(q_r) && mean.item<double>() > 0, "its preconditioner (",
              q_l.scalar_type(), ") is not finite or is zero: momentum entries up to ",
              ema.abs().max().item<double>(), " with precond_lr ", eta);
  st.Q_L(q_l * (mean / norm_l));
  st.Q_R(q_r * (mean / norm_r));
  st.lip_L(lip_l);
  st.lip_R(lip_r);

  auto update = precondition(st, ema).to(grad.scalar_type());
  detail::clip_update_rms(update, o.max_update_rms());
  st.step(s + 1);
  return update;
}

// ---- PsgdProOptions ------------------------------------------------------------

void PsgdProOptions::validate() const {
  detail::check_listed_fields(*this, kWho);
  TORCH_CHECK_VALUE(min_precond_lr_ <= precond_lr_, kWho, "min_precond_lr must be in [0, precond_lr = ", precond_lr_,
                    "], got ", min_precond_lr_);
}

// ---- PsgdPro -------------------------------------------------------------------

void PsgdPro::step_parameters() {
  detail::step_each_parameter<PsgdProParamState, PsgdProOptions>(
      *this, kWho,
      [this](const at::Tensor& p, PsgdProParamState& st, const PsgdProOptions& o) {
        const auto [rows, cols] = whole_matrix_dims(p);
        const auto grad = p.grad().reshape({rows, cols});
        return detail::psgd_pro_update(detail::l2_gradient(p, grad, o.weight_decay_method(), o.weight_decay()), st, o);
      },
      [](at::Tensor& p, const at::Tensor& u, const PsgdProOptions& o) {
        detail::decay_and_update(p, u, o.weight_decay_method(), o.lr(), o.weight_decay());
      });
}

// PSGD-Pro's entry (muon::PsgdPro): defaults are Emerging-Optimizers', lr
// and weight_decay aside (the common fields). It steps matrices: 1-D,
// embedding and head parameters go to scalar_optimizer.
void detail::register_psgd_pro(OptimizerRegistry& registry) {
  registry.add(detail::hookable<PsgdProOptions>(
      detail::listed_matrix_entry<PsgdPro>(
          detail::psgd_pro_state(),
          "PSGD-Pro (muon::PsgdPro): the momentum preconditioned by Kronecker factors fitted by Procrustes steps"),
      "decoupled"));
}

}  // namespace muon
