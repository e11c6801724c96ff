#pragma once

/// The SOAP optimizer on `torch::optim` (Vyas et al. 2024, "SOAP: Improving
/// and Stabilizing Shampoo using Adam", arXiv:2409.11321), with the
/// arithmetic and defaults of NVIDIA-NeMo/Emerging-Optimizers' SOAP
/// (emerging_optimizers/soap/soap.py and soap/soap_utils.py at commit
/// 18adc0bb8914db6942e3a1d814872570244b6fad, utils/eig.py at
/// fc96b03cfc55d11b89283f2b7d0e8da5bf5b47dc, the weight decay of mixin.py).
///
/// SOAP runs Adam in the eigenbasis of Shampoo's two Kronecker factors of a
/// matrix parameter G (m×n): L ← lerp(L, G·Gᵀ, 1 − β_s) and
/// R ← lerp(R, Gᵀ·G, 1 − β_s). Their eigenbases Q_L (m×m) and Q_R (n×n)
/// are refreshed every `precondition_frequency` steps: by eigh the first
/// time, then by `power_iter_steps` steps of orthogonal iteration
/// (Q ← qr(K·Q).Q after sorting Q's columns by Qᵀ·K·Q's diagonal, which
/// also permutes the second moment), or eigh every time with `use_eigh`.
/// One step (s = steps taken so far, t = s + 1):
///
///   β_s' = 1 − (1 − β_s)/(1 − β_s^t)        (correct_shampoo_beta_bias)
///   L, R ← lerp with G·Gᵀ, Gᵀ·G, 1 − β_s'
///   s ≥ adam_warmup_steps and (s = adam_warmup_steps or s % freq = 0):
///       m ← Q_L·m·Q_Rᵀ; refresh Q_L, Q_R; m ← Q_Lᵀ·m·Q_R
///   weight decay (decoupled p ← p − lr·wd·p; independent p ← p − wd·p;
///                 l2 G ← G + wd·p, for Adam only)
///   G' = Q_Lᵀ·G·Q_R                           (G' = G before the warm-up ends)
///   m ← lerp(m, G', 1 − β1); v ← lerp(v, G'², 1 − β2)
///   u = m̂ / (√v̂ + ε)                          (Adam with bias correction, optional Nesterov)
///   u ← Q_L·u·Q_Rᵀ; u ← u·min(1, max_update_rms/(rms(u) + 1e-7)) when max_update_rms > 0
///   p ← p − lr·u
///
/// Shapes: a parameter with ndim ≥ 2 is one matrix (dim 0) × (the product of
/// the others), as muon::Muon flattens conv weights (Emerging-Optimizers
/// keeps one factor per dimension instead; stacked experts are therefore
/// one matrix too: Emerging-Optimizers' StackedSOAP is another optimizer).
/// A 1-D parameter gets plain Adam with precondition_1d false (the default,
/// as in Emerging-Optimizers) or one factor L (n×n) and no R with
/// precondition_1d true. The moments are kept as that matrix (m×n) in the
/// eigenbasis; L, R, Q_L, Q_R in fp32 (fp64 for an fp64 parameter).
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "muon/enum_names.h"
#include "muon/optim/listed_fields.h"
#include "muon/optim/settings_digest.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"
#include "muon/optim/whole_matrix.h"

namespace muon {

/// How SOAP's weight decay enters the step (Emerging-Optimizers' WeightDecayMixin).
enum class SoapWeightDecay {
  kDecoupled,    ///< p ← p − lr·wd·p
  kIndependent,  ///< p ← p − wd·p
  kL2,           ///< G ← G + wd·p before Adam (the Kronecker factors see the raw G)
};

/// "decoupled" | "independent" | "l2".
MUON_ENUM_NAMES(SoapWeightDecay, parse_soap_weight_decay);

/// Options of `muon::Soap` (per parameter group), as chained setters, with
/// Emerging-Optimizers' names and defaults (lr aside: it has none there;
/// 3e-3 is its earlier default).
struct SoapOptions : public ListedOptions<SoapOptions> {
  MUON_OPTIONS(SoapOptions, 3e-3,
               /// Adam's first-moment decay, in [0, 1).
               (double, beta1, 0.9),
               /// Adam's second-moment decay, in [0, 1).
               (double, beta2, 0.95),
               /// Decay of the Kronecker factors L and R, in [0, 1).
               (double, shampoo_beta, 0.95),
               /// Added to Adam's √v̂, > 0 (0 would divide 0 by 0 on a zero gradient element).
               (double, eps, 1e-8),
               /// Weight decay, >= 0, applied as `weight_decay_method` says.
               (double, weight_decay, 0.01),
               /// decoupled (default) | independent | l2.
               (SoapWeightDecay, weight_decay_method, SoapWeightDecay::kDecoupled),
               /// Nesterov momentum in the inner Adam.
               (bool, use_nesterov, false),
               /// Steps between eigenbasis refreshes, >= 1.
               (int64_t, precondition_frequency, 1),
               /// Steps of plain Adam before the first eigenbasis (computed at step
               /// adam_warmup_steps + 1, 1-based), >= 0.
               (int64_t, adam_warmup_steps, 0),
               /// Precondition 1-D parameters with one factor (else plain Adam).
               (bool, precondition_1d, false),
               /// Adam's bias correction of both moments.
               (bool, correct_bias, true),
               /// Bias correction of the factors' EMA: 1 (yes), 0 (no), -1 (as correct_bias, the default).
               (int64_t, correct_shampoo_beta_bias, -1),
               /// Refresh the eigenbases by eigh every time (else orthogonal iteration after the first).
               (bool, use_eigh, false),
               /// Refresh a factor's eigenbasis only when Qᵀ·K·Q is not diagonal within
               /// `adaptive_update_tolerance` (‖diag‖ < (1 − tol)·‖K‖).
               (bool, use_adaptive_criteria, false),
               /// See use_adaptive_criteria; in [0, 1).
               (double, adaptive_update_tolerance, 1e-7),
               /// Orthogonal-iteration steps per refresh, >= 1.
               (int64_t, power_iter_steps, 1),
               /// Clip the update's RMS to this (0: no clipping), >= 0.
               (double, max_update_rms, 0.0))
  /// weight_decay_method by name.
  SoapOptions& weight_decay_method(const std::string& name);
  /// Whether the factors' EMA is bias-corrected (correct_shampoo_beta_bias, or correct_bias at -1).
  bool shampoo_bias_corrected() const {
    return correct_shampoo_beta_bias_ < 0 ? correct_bias_ : correct_shampoo_beta_bias_ != 0;
  }
  /// Checks every field; raises c10::ValueError "[muon::Soap] <arg> must be ..., got <value>".
  void validate() const;
};

/// Per-parameter state of `muon::Soap` (Emerging-Optimizers' names; its
/// GG = [L, R] and Q = [Q_L, Q_R] lists are fields here). For a matrix of
/// m×n (see the top of this header): exp_avg, exp_avg_sq m×n in the
/// parameter's dtype; L, Q_L m×m and R, Q_R n×n in fp32. A 1-D parameter
/// without precondition_1d has no L, R, Q_L, Q_R; with it, no R, Q_R.
/// Q_L and Q_R exist from the first eigenbasis refresh on. In the sharded
/// layout only the owner of a matrix holds these tensors (whole); every
/// rank counts `step`.
MUON_DEFINE_STATE(SoapParamState,
                  /// Adam's first moment, in the eigenbasis.
                  exp_avg,
                  /// Adam's second moment, in the eigenbasis.
                  exp_avg_sq,
                  /// Left Kronecker factor (EMA of G·Gᵀ).
                  L,
                  /// Right Kronecker factor (EMA of Gᵀ·G).
                  R,
                  /// Eigenbasis of L (columns by descending eigenvalue).
                  Q_L,
                  /// Eigenbasis of R.
                  Q_R);

namespace detail {

/// The (rows, cols) SOAP sees a parameter of `shape` as: (n, 1) for 1-D,
/// (dim 0, product of the others) otherwise.
std::pair<int64_t, int64_t> soap_matrix_dims(at::IntArrayRef shape);

/// SOAP's step on one whole matrix, without the weight decay of p and the
/// p update: updates `state` (creating its tensors at step 0) from `grad`
/// (m×n, the raw gradient: the factors' input) and `adam_grad` (m×n: grad,
/// or grad + wd·p under l2), and returns the update u (m×n, before −lr).
/// `one_d`: a 1-D parameter (grad is n×1). Every layout that runs SOAP
/// calls this one function on the whole matrix.
at::Tensor soap_matrix_update(const at::Tensor& grad, const at::Tensor& adam_grad, SoapParamState& state,
                              const SoapOptions& options, bool one_d);

/// SOAP's weight decay of `p` (decoupled or independent; l2 entered
/// adam_grad) and p ← p − lr·update (`update` of p's numel, or of its rows
/// in the sharded layout), as every layout applies them.
void soap_apply_update(at::Tensor& p, const at::Tensor& update, const SoapOptions& options);

}  // namespace detail

/// The SOAP optimizer: a `torch::optim::Optimizer` (see the top of this header).
///
///     muon::Soap opt(model->parameters(), muon::SoapOptions(3e-3).precondition_frequency(10));
///
/// Per-group options, `get_lr`/`set_lr` for LR schedulers, and `save`/`load`
/// in LibTorch's own optimizer archive layout with the options beside it.
class Soap : public WholeMatrixOptimizer<Soap, SoapOptions, SoapParamState> {
 public:
  using WholeMatrixOptimizer::WholeMatrixOptimizer;

  /// Messages say "[muon::Soap] ..."; archive keys "soap_groups", "soap_options/<i>", ...
  static constexpr OptimizerNames kNames{"muon::Soap", "soap"};
  /// SOAP steps 1-D parameters too (a column; Adam unless precondition_1d).
  static constexpr int64_t kMinDims = 1;

  /// Whether `param` is 1-D (its matrix is a column).
  virtual bool is_one_d(const at::Tensor& param) const { return param.dim() == 1; }

 protected:
  /// Steps every parameter with a gradient (after the step's checks).
  void step_parameters() override;
};

}  // namespace muon
