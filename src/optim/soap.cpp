// The SOAP optimizer: options, state, the whole-matrix step, save/load.
#include "muon/optim/soap.h"

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
#include "optim/eigenbasis.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "optim/step_transaction.h"
#include "optim/whole_matrix_optimizer.h"
#include "option_fields.h"
#include "util/fault_injection.h"
#include "util/names.h"

namespace muon {

// The archive's name of the options' enum field (muon/optim/listed_fields.h).
template <>
SoapWeightDecay detail::parse_listed_enum<SoapWeightDecay>(const std::string& name) {
  return parse_soap_weight_decay(name);
}

MUON_INSTANTIATE_LISTED(WholeMatrixOptimizer, Soap, SoapOptions, SoapParamState);

namespace {

constexpr const char* kWho = "[muon::Soap] ";
constexpr detail::EnumName<SoapWeightDecay> kWeightDecayMethods[] = {
    {SoapWeightDecay::kDecoupled, "decoupled"},
    {SoapWeightDecay::kIndependent, "independent"},
    {SoapWeightDecay::kL2, "l2"}};

// Qᵀ·x·Q_R: into the eigenbasis (an undefined Q is the identity).
at::Tensor to_eigenbasis(const at::Tensor& x, const at::Tensor& q_l, const at::Tensor& q_r) {
  auto y = q_l.defined() ? at::mm(q_l.t(), x) : x;
  return q_r.defined() ? at::mm(y, q_r) : y;
}

// Q_L·x·Q_Rᵀ: back from the eigenbasis.
at::Tensor from_eigenbasis(const at::Tensor& x, const at::Tensor& q_l, const at::Tensor& q_r) {
  auto y = q_l.defined() ? at::mm(q_l, x) : x;
  return q_r.defined() ? at::mm(y, q_r.t()) : y;
}

// diag(Qᵀ·K·Q) (utils/eig.py conjugate(diag=True)).
at::Tensor approx_eigvals(const at::Tensor& k, const at::Tensor& q) {
  return (at::mm(q.t(), k) * q.t()).sum(1);
}

// Whether Q diagonalizes K within `tolerance` (eig.py met_approx_eigvals_criteria).
bool diagonal_enough(const at::Tensor& k, const at::Tensor& eigvals, double tolerance) {
  return at::linalg_norm(eigvals).item<double>() >= (1 - tolerance) * at::linalg_norm(k).item<double>();
}

// Eigenvectors of the symmetric K, by descending eigenvalue (eig.py
// eigh_with_fallback): a diagonal K sorts its diagonal; otherwise eigh of
// K + eps·I (eps 1e-7 in fp32, 1e-15 in fp64), in fp64 if fp32 fails.
at::Tensor eigenbasis_eigh(const at::Tensor& k) {
  detail::fault_point("SOAP's eigh");
  const bool diagonal = !k.triu(1).any().item<bool>() && !k.tril(-1).any().item<bool>();
  if (diagonal) {
    const auto order = std::get<1>(k.diagonal().sort(/*dim=*/-1, /*descending=*/true));
    return at::eye(k.size(0), k.options()).index_select(1, order);
  }
  const double eps = k.scalar_type() == at::kDouble ? 1e-15 : 1e-7;
  const auto eye = at::eye(k.size(0), k.options());
  const auto stabilized = at::addmm(k, eye, eye, /*beta=*/1, /*alpha=*/eps);
  at::Tensor q;
  try {
    q = std::get<1>(at::linalg_eigh(stabilized));
  } catch (const c10::Error&) {
    q = std::get<1>(at::linalg_eigh(stabilized.to(at::kDouble))).to(k.scalar_type());
  }
  return q.flip({-1});
}

// One factor's refresh by orthogonal iteration (soap_utils.py
// get_eigenbasis_qr, eig.py orthogonal_iteration): Q's columns sorted by
// descending approximate eigenvalue (exp_avg_sq's `axis` permuted alike),
// then power_iter_steps of Q ← qr(K·Q).Q. Returns the new Q, or `q` itself
// when the adaptive criterion says it diagonalizes K well enough.
at::Tensor refresh_by_qr(const at::Tensor& k, const at::Tensor& q, at::Tensor& exp_avg_sq, int64_t axis,
                         const SoapOptions& o) {
  const auto eigvals = approx_eigvals(k, q);
  if (o.use_adaptive_criteria() && diagonal_enough(k, eigvals, o.adaptive_update_tolerance())) return q;
  detail::fault_point("SOAP's QR");
  const auto order = at::argsort(eigvals, /*dim=*/0, /*descending=*/true);
  exp_avg_sq = exp_avg_sq.index_select(axis, order);
  auto out = q.index_select(1, order);
  for (int64_t i = 0; i < o.power_iter_steps(); ++i) out = std::get<0>(at::linalg_qr(at::mm(k, out)));
  return out;
}

// One factor's refresh by eigh (soap_utils.py get_eigenbasis_eigh), kept
// under the adaptive criterion as refresh_by_qr.
at::Tensor refresh_by_eigh(const at::Tensor& k, const at::Tensor& q, const SoapOptions& o) {
  if (o.use_adaptive_criteria() && q.defined() &&
      diagonal_enough(k, approx_eigvals(k, q), o.adaptive_update_tolerance())) {
    return q;
  }
  return eigenbasis_eigh(k);
}

// Emerging-Optimizers' calculate_adam_update on the projected gradient
// (step t, 1-based): the moments updated in place, the update returned.
at::Tensor adam_update(const at::Tensor& g, SoapParamState& st, const SoapOptions& o, double t) {
  auto& m = st.exp_avg();
  auto& v = st.exp_avg_sq();
  m.lerp_(g, 1 - o.beta1());
  detail::accumulate_second_moment(v, g, o.beta2());
  const double bias1 = o.correct_bias() ? 1 - std::pow(o.beta1(), t) : 1.0;
  const double bias2 = o.correct_bias() ? 1 - std::pow(o.beta2(), t) : 1.0;
  at::Tensor momentum;
  if (o.use_nesterov()) {
    const double bias_next = o.correct_bias() ? 1 - std::pow(o.beta1(), t + 1) : 1.0;
    momentum = m * (o.beta1() / bias_next) + g * ((1 - o.beta1()) / bias1);
  } else {
    momentum = m / bias1;
  }
  return momentum / detail::second_moment_denominator(v, bias2, o.eps());
}

}  // namespace

MUON_DEFINE_ENUM_NAMES(SoapWeightDecay, parse_soap_weight_decay, kWeightDecayMethods, kWho, "weight_decay_method");

namespace detail {

std::pair<int64_t, int64_t> soap_matrix_dims(at::IntArrayRef shape) {
  if (shape.size() == 1) return {shape[0], 1};
  int64_t cols = 1;
  for (size_t d = 1; d < shape.size(); ++d) cols *= shape[d];
  return {shape.empty() ? 1 : shape[0], cols};
}

at::Tensor soap_matrix_update(const at::Tensor& grad, const at::Tensor& adam_grad, SoapParamState& st,
                              const SoapOptions& o, const bool one_d) {
  const int64_t s = st.step();
  const double t = static_cast<double>(s + 1);
  const bool left = !one_d || o.precondition_1d();
  const bool right = !one_d;
  const auto wide = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto factor_options = grad.options().dtype(wide);
  if (!st.exp_avg().defined()) st.exp_avg(at::zeros_like(grad, at::MemoryFormat::Contiguous));
  if (!st.exp_avg_sq().defined()) st.exp_avg_sq(at::zeros_like(grad, at::MemoryFormat::Contiguous));
  if (left && !st.L().defined()) st.L(at::zeros({grad.size(0), grad.size(0)}, factor_options));
  if (right && !st.R().defined()) st.R(at::zeros({grad.size(1), grad.size(1)}, factor_options));

  // The Kronecker factors, from the raw gradient.
  double shampoo_beta = o.shampoo_beta();
  if (o.shampoo_bias_corrected()) shampoo_beta = 1 - (1 - shampoo_beta) / (1 - std::pow(shampoo_beta, t));
  const auto g = grad.to(wide);
  if (left) st.L().lerp_(at::mm(g, g.t()), 1 - shampoo_beta);
  if (right) st.R().lerp_(at::mm(g.t(), g), 1 - shampoo_beta);
  // A factor beyond the range of its dtype has no eigenbasis: eigh fails or
  // returns NaN. Raised as c10::Error: the step names the parameter and
  // restores what it changed.
  for (const auto* factor : {&st.L(), &st.R()}) {
    TORCH_CHECK(!factor->defined() || all_finite(*factor), "its Kronecker factor ",
                factor == &st.L() ? "L" : "R", " (", factor->scalar_type(),
                ") is not finite: gradient entries up to ", grad.abs().max().item<double>(),
                " make g·gᵀ larger than the dtype holds");
  }

  // The eigenbases: eigh at the first refresh, then as the options say; the
  // momentum is rotated from the old basis into the new one.
  const bool preconditioned = s >= o.adam_warmup_steps();
  const bool first = s == o.adam_warmup_steps();
  if (left && preconditioned && (first || s % o.precondition_frequency() == 0)) {
    auto m = from_eigenbasis(st.exp_avg(), st.Q_L(), st.Q_R());
    // The bases are kept row-major, as a checkpoint loads them: eigh and
    // QR return column-major matrices, and a product takes another BLAS
    // path (rounded otherwise on some CPUs) for another layout, so a resumed
    // run would leave the uninterrupted one.
    if (first || o.use_eigh()) {
      st.Q_L(refresh_by_eigh(st.L(), st.Q_L(), o).contiguous());
      if (right) st.Q_R(refresh_by_eigh(st.R(), st.Q_R(), o).contiguous());
    } else {
      at::Tensor v = st.exp_avg_sq();
      st.Q_L(refresh_by_qr(st.L(), st.Q_L(), v, 0, o).contiguous());
      if (right) st.Q_R(refresh_by_qr(st.R(), st.Q_R(), v, 1, o).contiguous());
      st.exp_avg_sq(v);
    }
    st.exp_avg(to_eigenbasis(m, st.Q_L(), st.Q_R()).to(st.exp_avg().scalar_type()).contiguous());
  }

  at::Tensor update;
  if (preconditioned && left) {
    const auto projected = to_eigenbasis(adam_grad.to(wide), st.Q_L(), st.Q_R()).to(grad.scalar_type());
    const auto u = adam_update(projected, st, o, t);
    update = from_eigenbasis(u.to(wide), st.Q_L(), st.Q_R()).to(grad.scalar_type());
  } else {
    update = adam_update(adam_grad, st, o, t);
  }
  clip_update_rms(update, o.max_update_rms());
  st.step(s + 1);
  return update;
}

}  // namespace detail

SoapOptions& SoapOptions::weight_decay_method(const std::string& name) {
  weight_decay_method_ = parse_soap_weight_decay(name);
  return *this;
}

void SoapOptions::validate() const {
  detail::check_non_negative(kWho, {{"lr", lr_}, {"weight_decay", weight_decay_}, {"max_update_rms", max_update_rms_}});
  detail::check_decay(kWho, {{"beta1", beta1_},
                             {"beta2", beta2_},
                             {"shampoo_beta", shampoo_beta_},
                             {"adaptive_update_tolerance", adaptive_update_tolerance_}});
  detail::check_denominator_eps(kWho, eps_);
  TORCH_CHECK_VALUE(precondition_frequency_ >= 1, kWho, "precondition_frequency must be >= 1, got ",
                    precondition_frequency_);
  TORCH_CHECK_VALUE(adam_warmup_steps_ >= 0, kWho, "adam_warmup_steps must be >= 0, got ", adam_warmup_steps_);
  TORCH_CHECK_VALUE(correct_shampoo_beta_bias_ >= -1 && correct_shampoo_beta_bias_ <= 1, kWho,
                    "correct_shampoo_beta_bias must be -1 (as correct_bias), 0 or 1, got ",
                    correct_shampoo_beta_bias_);
  TORCH_CHECK_VALUE(power_iter_steps_ >= 1, kWho, "power_iter_steps must be >= 1, got ", power_iter_steps_);
}

void detail::soap_apply_update(at::Tensor& p, const at::Tensor& update, const SoapOptions& o) {
  if (o.weight_decay() != 0 && o.weight_decay_method() != SoapWeightDecay::kL2) {
    const double rate =
        o.weight_decay_method() == SoapWeightDecay::kDecoupled ? o.lr() * o.weight_decay() : o.weight_decay();
    p.add_(p, -rate);
  }
  p.add_(update.view(p.sizes()), -o.lr());
}

void Soap::step_parameters() {
  detail::step_each_parameter<SoapParamState, SoapOptions>(
      *this, kWho,
      [](const at::Tensor& p, SoapParamState& st, const SoapOptions& o) {
        const auto [rows, cols] = detail::soap_matrix_dims(p.sizes());
        const auto grad = p.grad().reshape({rows, cols});
        auto adam_grad = grad;
        if (o.weight_decay() != 0 && o.weight_decay_method() == SoapWeightDecay::kL2) {
          adam_grad = grad.add(p.detach().reshape({rows, cols}), o.weight_decay());
        }
        return detail::soap_matrix_update(grad, adam_grad, st, o, p.dim() == 1);
      },
      detail::soap_apply_update);
}

// Defaults are SoapOptions' own (Emerging-Optimizers'), lr and weight_decay aside (the common
// fields). Like Muon, SOAP preconditions matrices: 1-D, embedding and head parameters go to scalar_optimizer.
void detail::register_soap(OptimizerRegistry& registry) {
  using O = SoapOptions;
  using F = detail::OptionFields<O>;
  const O d;
  auto e = detail::matrix_entry<Soap, O>(
      "soap", detail::soap_state(), "SOAP (muon::Soap): Adam in the eigenbasis of Shampoo's Kronecker factors",
      {
          F::real("beta1", &O::beta1, "Adam's first-moment decay", 0.0, 1.0).exclusive_max(),
          F::real("beta2", &O::beta2, "Adam's second-moment decay", 0.0, 1.0).exclusive_max(),
          F::real("shampoo_beta", &O::shampoo_beta, "decay of the Kronecker factors L and R", 0.0, 1.0).exclusive_max(),
          F::real("eps", &O::eps, "added to the square root of Adam's second moment", 0.0).exclusive_min(),
          F::common("weight_decay", &O::weight_decay),
          F::text("weight_decay_method", &O::weight_decay_method, to_string(d.weight_decay_method()),
                  "how weight decay enters the step", detail::weight_decay_method_names()),
          F::boolean("use_nesterov", &O::use_nesterov, "Nesterov momentum in the inner Adam"),
          F::integer("precondition_frequency", &O::precondition_frequency, "steps between eigenbasis refreshes", 1.0),
          F::integer("adam_warmup_steps", &O::adam_warmup_steps, "steps of plain Adam before the first eigenbasis",
                     0.0),
          F::boolean("precondition_1d", &O::precondition_1d, "precondition 1-D parameters with one factor"),
          F::boolean("correct_bias", &O::correct_bias, "Adam-style bias correction of both moments"),
          F::custom(
              FieldSpec::text("correct_shampoo_beta_bias", "auto",
                              "bias correction of the factors' EMA (auto: as correct_bias)", {"auto", "true", "false"}),
              [](O& o, const OptimizerSettings& s) {
                const auto& bias = s.get_string("correct_shampoo_beta_bias");
                o.correct_shampoo_beta_bias(bias == "auto" ? -1 : bias == "true" ? 1 : 0);
              }),
          F::boolean("use_eigh", &O::use_eigh, "refresh the eigenbases by eigh (else orthogonal iteration)"),
          F::boolean("use_adaptive_criteria", &O::use_adaptive_criteria,
                     "refresh an eigenbasis only when it no longer diagonalizes its factor"),
          F::real("adaptive_update_tolerance", &O::adaptive_update_tolerance, "tolerance of use_adaptive_criteria", 0.0,
                  1.0)
              .exclusive_max(),
          F::integer("power_iter_steps", &O::power_iter_steps, "orthogonal-iteration steps per refresh", 1.0),
          F::real("max_update_rms", &O::max_update_rms, "clip the update's RMS to this (0: no clipping)", 0.0),
      });
  registry.add(detail::hookable<O>(std::move(e), "decoupled"));
}

}  // namespace muon
