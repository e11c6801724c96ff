#pragma once

/// The KL-Shampoo SOAP family on `torch::optim`, with the arithmetic and
/// defaults of NVIDIA-NeMo/Emerging-Optimizers at commit fd77292, one class
/// for six registry entries (KlSoapOptions::kind):
///
///   kl_soap       shampoo/soap_v3.py KlSoapV3: KL factors, one orthogonal
///                 iteration a step, Adam in the eigenbasis
///   kl_m_soap     soap_v3.py KlMSoap: as kl_soap with MAdam inside
///   rekls_v3      soap_v3.py ReklsV3: as kl_soap with eigh every step
///   rekls         legacy_soap/rekls.py REKLS (legacy SOAP with use_eigh and
///                 use_kl_shampoo): as rekls_v3, weight decay by any method
///   tp_rekls      legacy_soap/tp_rekls.py TpRekls: rekls, run in the
///                 tensor_parallel layout on the gathered whole matrix
///                 (muon::distributed::TensorParallelKlSoap; rekls runs there
///                 too). TpRekls adds the l2 term to the gradient before its
///                 Kronecker factors see it; here, as REKLS, they see the raw
///                 gradient (the default decoupled decay is the same in both)
///   stacked_soap  legacy_soap/stacked_soap.py StackedSoap: kl_soap on a
///                 3-D (b, m, n) parameter seen as (m, b·n) when n ≤ m, else
///                 (b·m, n)
///
/// One step t (1-based) on the matrix G (m × n), λ the eigenvalues stored
/// with Q at the last refresh (0 and I before the first):
///
///   β' = 1 − (1 − shampoo_beta) / (1 − shampoo_beta^t)
///   L ← L + (1 − β')·((1/n)·G·Q_R·diag(max(λ_R, eps)⁻¹)·Q_Rᵀ·Gᵀ − L)
///   R ← R + (1 − β')·((1/m)·Gᵀ·Q_L·diag(max(λ_L, eps)⁻¹)·Q_Lᵀ·G − R)
///   t = 1, or every step for rekls and rekls_v3: Q, λ ← eigh(L), eigh(R),
///       descending (fp64 if fp32 fails); otherwise one orthogonal
///       iteration Q ← qr(K·Q).Q, its columns sorted by descending
///       λ = diag(Qᵀ·K·Q). The first moment m is carried from the old basis
///       into the new one (Q_L·m·Q_Rᵀ, then Q_Lᵀ·(·)·Q_R); v is not.
///   weight decay  decoupled p ← p − lr·wd·p (rekls also "independent"
///       p ← p − wd·p, or "l2": the inner step sees G + wd·p)
///   G' = Q_Lᵀ·G·Q_R
///   Adam   m ← m + (1 − β1)(G' − m); v ← v + (1 − β2)(G'² − v);
///          U = (m / c1) / (√(v / c2) + eps), c_i = 1 − β_i^t
///   MAdam  v ← v + (1 − β2)((2⁸·G')² − v); U = (m / c1) / √(v / c2)·2⁸,
///          0 where m = 0 (no eps)
///   p ← p − lr·Q_L·U·Q_Rᵀ
///
/// The state is fp32 (fp64 for fp64 parameters), as Emerging-Optimizers
/// keeps it fp32. Emerging-Optimizers accepts 2-D parameters only (3-D too
/// for stacked_soap); here a parameter of 3 or more dims is one matrix (dim 0
/// × the product of the others), and stacked_soap takes 2-D and 3-D.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "muon/optim/listed_fields.h"
#include "muon/optim/settings_digest.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"
#include "muon/optim/whole_matrix.h"

namespace muon {

/// Options of `muon::KlSoap` (per parameter group), as chained setters, with
/// Emerging-Optimizers' names and defaults (lr, which it requires, 3e-3 as
/// muon::Soap's).
/// validate(): checks every field by its rule, and weight_decay_method is "decoupled" unless kind is rekls or tp_rekls;
/// raises c10::ValueError "[muon::KlSoap] <arg> must be ..., got <value>".
MUON_DEFINE_OPTIONS(KlSoapOptions, 3e-3,
                    /// The inner step's first-moment decay, in [0, 1).
                    (double, beta1, 0.9, rule::decay("the inner step's first-moment decay")),
                    /// The inner step's second-moment decay, in [0, 1).
                    (double, beta2, 0.95, rule::decay("the inner step's second-moment decay")),
                    /// Decay of the Kronecker factors (bias-corrected), in [0, 1).
                    (double, shampoo_beta, 0.95, rule::decay("decay of the Kronecker factors (bias-corrected)")),
                    /// The eigenvalues' floor in the KL factor update, and Adam's eps; > 0.
                    (double, eps, 1e-8, rule::positive("the eigenvalues' floor in the KL factor update; Adam's eps")),
                    /// Weight decay, >= 0.
                    (double, weight_decay, 0.01, rule::non_negative("decoupled weight decay")),
                    /// "decoupled"; rekls and tp_rekls also "independent" or "l2".
                    (std::string, weight_decay_method, "decoupled", rule::weight_decay_method()),
                    /// The entry: "kl_soap", "kl_m_soap", "rekls", "tp_rekls", "rekls_v3" or "stacked_soap".
                    (std::string, kind, "kl_soap",
                     rule::one_of("the variant (the entry's name)",
                                  "kl_soap|kl_m_soap|rekls|tp_rekls|rekls_v3|stacked_soap")));

/// Per-parameter state of `muon::KlSoap`, all of the (stacked) matrix and
/// held by the process that steps it (the owner in the sharded layout), made
/// by the first step; Emerging-Optimizers' names.
MUON_DEFINE_STATE(KlSoapParamState,
                  /// m, the first moment in the eigenbasis (m × n).
                  exp_avg,
                  /// v, the second moment in the eigenbasis (m × n; MAdam's scaled by 2¹⁶).
                  exp_avg_sq,
                  /// L (m × m) and R (n × n), the Kronecker factors.
                  L, R,
                  /// Q_L and Q_R, their eigenbases (columns by descending eigenvalue).
                  Q_L, Q_R,
                  /// λ_L (m) and λ_R (n), the eigenvalues found with them.
                  eigvals_L, eigvals_R);

namespace detail {

/// The matrix `kind` preconditions for a parameter of `rows` (dim 0) and
/// trailing dims `trailing`: stacked_soap's (m, b·n) or (b·m, n) for 3-D
/// parameters, otherwise rows × the product of `trailing`.
std::pair<int64_t, int64_t> kl_soap_matrix_dims(const std::string& kind, int64_t rows, at::IntArrayRef trailing);

/// One step of the family on one whole parameter: `grad` and `inner_grad`
/// (the gradient the inner step sees: `grad`, or grad + wd·p under l2) as
/// rows × the product of `trailing`; creates the state at its first step,
/// counts the step and returns the update U' = Q_L·U·Q_Rᵀ in the same
/// layout and the gradient's dtype, which the caller applies after weight
/// decay as p ← p − lr·U'. Every layout runs it on whole parameters.
at::Tensor kl_soap_update(const at::Tensor& grad, const at::Tensor& inner_grad, at::IntArrayRef trailing,
                          KlSoapParamState& state, const KlSoapOptions& options);

}  // namespace detail

/// The KL-Shampoo SOAP family: a `torch::optim::Optimizer` for parameters
/// of at least 2 dims (stacked_soap: 2 or 3; see the top of this header).
///
///     muon::KlSoap opt(model->parameters(), muon::KlSoapOptions(3e-3).kind("rekls"));
class KlSoap : public WholeMatrixOptimizer<KlSoap, KlSoapOptions, KlSoapParamState> {
 public:
  using WholeMatrixOptimizer::WholeMatrixOptimizer;

  /// Messages say "[muon::KlSoap] ..."; archive keys "kl_soap_groups", "kl_soap_options/<i>", ...
  static constexpr OptimizerNames kNames{"muon::KlSoap", "kl_soap"};
  /// The options' checks and the parameters' dims (stacked_soap: 2 or 3).
  void check_before_step() override;
  /// The (stacked) matrix `param`'s state is of.
  std::pair<int64_t, int64_t> preconditioned_dims(const at::Tensor& param) const;

 protected:
  /// Steps every parameter with a gradient (after the step's checks).
  void step_parameters() override;
};

}  // namespace muon
