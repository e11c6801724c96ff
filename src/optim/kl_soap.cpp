// The KL-Shampoo SOAP family: options, the whole-parameter step, and the
// registry entries kl_soap, kl_m_soap, rekls, rekls_v3 and stacked_soap.
#include "muon/optim/kl_soap.h"

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
#include "util/names.h"

namespace muon {

MUON_INSTANTIATE_LISTED(WholeMatrixOptimizer, KlSoap, KlSoapOptions, KlSoapParamState);

namespace {

constexpr const char* kWho = "[muon::KlSoap] ";

// Whether `kind` takes a weight decay method other than "decoupled" (rekls'
// kinds; Emerging-Optimizers fixes it for the others).
bool takes_weight_decay_method(const std::string& kind) { return kind == "rekls" || kind == "tp_rekls"; }

// MAdam's √s for scale_log2 16 (soap_v3.py KlMSoap): a power of two, exact.
constexpr double kMadamScale = 256.0;

bool stacks(const std::string& kind, at::IntArrayRef trailing) {
  return kind == "stacked_soap" && trailing.size() == 2;
}

// The (stacked) matrix of a rows × prod(trailing) tensor, and back.
at::Tensor to_matrix(const at::Tensor& x, const std::string& kind, at::IntArrayRef trailing) {
  if (!stacks(kind, trailing)) return x;
  const int64_t b = x.size(0), m = trailing[0], n = trailing[1];
  if (n <= m) return x.reshape({b, m, n}).permute({1, 0, 2}).reshape({m, b * n});
  return x.reshape({b * m, n});
}

at::Tensor from_matrix(const at::Tensor& x, const std::string& kind, at::IntArrayRef trailing, int64_t rows) {
  if (!stacks(kind, trailing)) return x;
  const int64_t m = trailing[0], n = trailing[1];
  if (n <= m) return x.reshape({m, rows, n}).permute({1, 0, 2}).reshape({rows, m * n});
  return x.reshape({rows, m * n});
}

// (1/d)·Gᵀ-side conjugate of Q·diag(max(λ, eps)⁻¹)·Qᵀ: `g` is G for L's
// update (Q, λ of R, d = n) or Gᵀ for R's (Q, λ of L, d = m).
at::Tensor kl_term(const at::Tensor& g, const at::Tensor& q, const at::Tensor& eigvals, double eps) {
  const auto scale = eigvals.clamp_min(eps).reciprocal() / static_cast<double>(g.size(1));
  const auto correction = at::mm(q * scale.unsqueeze(0), q.t());
  return at::mm(at::mm(g, correction), g.t());
}

// The inner step on the projected gradient: Adam (kl_soap, rekls, rekls_v3,
// stacked_soap) or MAdam (kl_m_soap); the moments updated in place.
at::Tensor inner_step(const at::Tensor& g, KlSoapParamState& st, const KlSoapOptions& o, double t) {
  auto& m = st.exp_avg();
  auto& v = st.exp_avg_sq();
  const double c1 = 1 - std::pow(o.beta1(), t);
  const double c2 = 1 - std::pow(o.beta2(), t);
  m.lerp_(g, 1 - o.beta1());
  if (o.kind() == "kl_m_soap") {
    v.lerp_((g * kMadamScale).square(), 1 - o.beta2());
    auto u = (m / c1) / (v / c2).sqrt() * kMadamScale;
    return u.masked_fill_(m.eq(0), 0.0);
  }
  v.lerp_(g.square(), 1 - o.beta2());
  return (m / c1) / ((v / c2).sqrt() + o.eps());
}

}  // namespace

std::pair<int64_t, int64_t> detail::kl_soap_matrix_dims(const std::string& kind, int64_t rows,
                                                         at::IntArrayRef trailing) {
  if (stacks(kind, trailing)) {
    const int64_t m = trailing[0], n = trailing[1];
    return n <= m ? std::make_pair(m, rows * n) : std::make_pair(rows * m, n);
  }
  int64_t cols = 1;
  for (const auto d : trailing) cols *= d;
  return {rows, cols};
}

at::Tensor detail::kl_soap_update(const at::Tensor& grad, const at::Tensor& inner_grad, at::IntArrayRef trailing,
                                  KlSoapParamState& st, const KlSoapOptions& o) {
  const auto wide = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto g = to_matrix(grad, o.kind(), trailing).to(wide);
  const int64_t m = g.size(0), n = g.size(1);
  if (!st.exp_avg().defined()) {
    const auto options = g.options();
    st.exp_avg(at::zeros({m, n}, options));
    st.exp_avg_sq(at::zeros({m, n}, options));
    st.L(at::zeros({m, m}, options));
    st.R(at::zeros({n, n}, options));
    st.Q_L(at::eye(m, options));
    st.Q_R(at::eye(n, options));
    st.eigvals_L(at::zeros({m}, options));
    st.eigvals_R(at::zeros({n}, options));
  }
  const int64_t s = st.step();
  const double t = static_cast<double>(s + 1);

  // The KL factors, each corrected by the other's stored eigenbasis.
  const double beta = 1 - (1 - o.shampoo_beta()) / (1 - std::pow(o.shampoo_beta(), t));
  const auto to_l = kl_term(g, st.Q_R(), st.eigvals_R(), o.eps());
  const auto to_r = kl_term(g.t(), st.Q_L(), st.eigvals_L(), o.eps());
  st.L().lerp_(to_l, 1 - beta);
  st.R().lerp_(to_r, 1 - beta);
  // A factor beyond the range of its dtype has no eigenbasis. Raised as
  // c10::Error: the step names the parameter and restores what it changed.
  for (const auto* factor : {&st.L(), &st.R()}) {
    TORCH_CHECK(all_finite(*factor), "its Kronecker factor ", factor == &st.L() ? "L" : "R", " (",
                factor->scalar_type(), ") is not finite: gradient entries up to ", grad.abs().max().item<double>(),
                " over eigenvalues down to eps ", o.eps(), " make it larger than the dtype holds");
  }

  // The eigenbases; m carried from the old basis into the new one.
  const auto momentum = at::mm(at::mm(st.Q_L(), st.exp_avg()), st.Q_R().t());
  const bool eigh = s == 0 || o.kind() == "rekls" || o.kind() == "tp_rekls" || o.kind() == "rekls_v3";
  auto [wl, ql] = eigh ? detail::eigh_descending(st.L()) : detail::orthogonal_iteration(st.L(), st.Q_L(), 1);
  auto [wr, qr] = eigh ? detail::eigh_descending(st.R()) : detail::orthogonal_iteration(st.R(), st.Q_R(), 1);
  st.Q_L(ql);
  st.Q_R(qr);
  st.eigvals_L(wl);
  st.eigvals_R(wr);
  st.exp_avg(at::mm(at::mm(ql.t(), momentum), qr).contiguous());

  // The inner step in the eigenbasis, and back.
  const auto inner = inner_grad.is_same(grad) ? g : to_matrix(inner_grad, o.kind(), trailing).to(wide);
  const auto u = inner_step(at::mm(at::mm(ql.t(), inner), qr), st, o, t);
  const auto update = at::mm(at::mm(ql, u), qr.t());
  st.step(s + 1);
  return from_matrix(update, o.kind(), trailing, grad.size(0)).to(grad.scalar_type());
}

// ---- KlSoapOptions ----------------------------------------------------------------

void KlSoapOptions::validate() const {
  detail::check_listed_fields(*this, kWho);
  TORCH_CHECK_VALUE(weight_decay_method_ == "decoupled" || takes_weight_decay_method(kind_), kWho,
                    "weight_decay_method must be 'decoupled' for ", kind_,
                    " (Emerging-Optimizers fixes it; rekls takes others), got '", weight_decay_method_, "'");
}

// ---- KlSoap ---------------------------------------------------------------------

void KlSoap::check_before_step() {
  WholeMatrixOptimizer::check_before_step();
  for (const auto g : c10::irange(param_groups_.size())) {
    const auto& o = static_cast<const KlSoapOptions&>(param_groups_[g].options());
    if (o.kind() != "stacked_soap") continue;
    for (const auto& p : param_groups_[g].params()) {
      TORCH_CHECK_VALUE(p.dim() <= 3, kWho, "parameter of group ", g, " has ", p.dim(),
                        " dims; stacked_soap steps 2-D matrices and 3-D stacks of them");
    }
  }
}

std::pair<int64_t, int64_t> KlSoap::preconditioned_dims(const at::Tensor& param) const {
  const auto& o = static_cast<const KlSoapOptions&>(defaults());
  const auto [rows, cols] = whole_matrix_dims(param);
  // A 2-D parameter is its whole matrix's block in the tensor-parallel layout.
  if (param.dim() == 2) return detail::kl_soap_matrix_dims(o.kind(), rows, {cols});
  return detail::kl_soap_matrix_dims(o.kind(), rows, param.sizes().slice(1));
}

void KlSoap::step_parameters() {
  detail::step_each_parameter<KlSoapParamState, KlSoapOptions>(
      *this, kWho,
      [this](const at::Tensor& p, KlSoapParamState& st, const KlSoapOptions& o) {
        const auto [rows, cols] = whole_matrix_dims(p);
        const auto grad = p.grad().reshape({rows, cols});
        const auto inner = detail::l2_gradient(p, grad, o.weight_decay_method(), o.weight_decay());
        return detail::kl_soap_update(grad, inner, p.sizes().slice(1), st, o);
      },
      [](at::Tensor& p, const at::Tensor& u, const KlSoapOptions& o) {
        detail::decay_and_update(p, u, o.weight_decay_method(), o.lr(), o.weight_decay());
      });
}

// ---- the registry entries -------------------------------------------------------

// The family's entries (muon::KlSoap with its kind fixed): defaults are
// Emerging-Optimizers', lr and weight_decay aside (the common fields); rekls
// alone takes weight_decay_method. They step matrices: 1-D, embedding and
// head parameters go to scalar_optimizer.
void detail::register_kl_soap(OptimizerRegistry& registry) {
  using O = KlSoapOptions;
  const std::array<std::pair<const char*, const char*>, 6> kinds{{
      {"kl_soap", "KL-SOAP (muon::KlSoap): Adam in the eigenbasis of KL-Shampoo's factors, one orthogonal "
                  "iteration a step (Emerging-Optimizers' KlSoapV3)"},
      {"kl_m_soap", "KL-M-SOAP (muon::KlSoap): kl_soap with MAdam (no eps, scaled second moment) inside"},
      {"rekls", "REKLS (muon::KlSoap): KL-Shampoo's factors, their eigenbases by eigh every step, Adam inside "
                "(Emerging-Optimizers' legacy REKLS)"},
      {"tp_rekls", "REKLS for the tensor_parallel layout (muon::KlSoap; there "
                   "muon::distributed::TensorParallelKlSoap): rekls' arithmetic, Emerging-Optimizers' TpRekls"},
      {"rekls_v3", "REKLS v3 (muon::KlSoap): rekls as Emerging-Optimizers' ReklsV3 (decoupled weight decay)"},
      {"stacked_soap", "Stacked SOAP (muon::KlSoap): kl_soap on a 3-D stack (b, m, n) seen as (m, b·n) when n <= m, "
                       "else (b·m, n)"},
  }};
  for (const auto& [name, doc] : kinds) {
    // The entry's name is the kind; only rekls' kinds take another weight decay method.
    auto fields = takes_weight_decay_method(name) ? detail::listed_option_fields<O>({"kind"})
                                                  : detail::listed_option_fields<O>({"kind", "weight_decay_method"});
    auto e = detail::options_entry<KlSoap, O>(name, detail::kl_soap_state(name), doc, std::move(fields),
                                              [kind = std::string(name)](O& o, const OptimizerSettings&) {
                                                o.kind(kind);
                                              });
    e.default_overrides = detail::scalar_defaults(name);
    registry.add(detail::hookable<O>(std::move(e), "decoupled"));
  }
}

}  // namespace muon
