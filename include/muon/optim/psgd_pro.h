#pragma once

/// PSGD-Pro on `torch::optim`: PSGD with a Kronecker-factored whitening
/// preconditioner fitted by Procrustes steps, with the arithmetic and
/// defaults of NVIDIA-NeMo/Emerging-Optimizers' PSGDPro at commit fd77292
/// (emerging_optimizers/psgd/psgd.py, procrustes_step.py,
/// psgd_kron_contractions.py, psgd_utils.py; Li, arXiv:1512.04202 and
/// arXiv:2402.11858).
///
/// Each parameter is one matrix G (m × n: dim 0 × the product of the
/// others) with factors Q_L (m × m) and Q_R (n × n), both init_scale·I, and
/// Lipschitz constants ℓ_L, ℓ_R, both 1. One step s (0-based):
///
///   weight decay   decoupled p ← p − lr·wd·p; independent p ← p − wd·p;
///                  l2 G ← G + wd·p
///   m ← m + (1 − momentum)·(G − m)
///   η = max(precond_lr / √(1 + s / warmup_steps), min_precond_lr)
///   D = m + (damping_noise_scale + 1e-7·|m|)·N            (N ~ N(0, 1))
///   P = Q_Lᵀ·Q_L·D·Q_Rᵀ·Q_R
///   for each side (left: C = P·Pᵀ, k = m; right: C = Pᵀ·P, k = n), both
///   from the same P, with c = m·n / k:
///       b = bound(C) + c,  ℓ ← max(β·ℓ + (1 − β)·b, b)   (β = beta_lip)
///       Q ← Q − η/ℓ·(C·Q − c·Q),  then one Procrustes step on Q
///   Q_L, Q_R rescaled so that both max |entries| are their geometric mean
///   u = Q_Lᵀ·Q_L·m·Q_Rᵀ·Q_R, its RMS clipped to max_update_rms (0: not)
///   p ← p − lr·u
///
/// bound(C) is the subspace-iteration lower bound of the spectral norm
/// (32 random vectors aligned with C's largest row, 2 half-iterations,
/// C scaled by its largest diagonal entry); the Procrustes step rotates Q
/// towards symmetry: R = (Qᵀ − Q)/max(bound(Qᵀ − Q), 1e-8) (bound scaled by
/// the largest |entry|), a = clamp(−tr(R·Q)/tr(R·R·Q), 0, 1/8) when
/// tr(R·R·Q) < 0 else 1/8, Q ← Q + a·(R·Q + a/2·R·R·Q).
///
/// The random draws (N, then per side the bound's vectors for C and for R,
/// left before right) come from a CPU generator seeded by (seed, m, n,
/// step), in the state's dtype, so every layout draws what one process
/// draws (Emerging-Optimizers draws from torch's global generator). The
/// state is fp32 (fp64 for fp64 parameters). Emerging-Optimizers keeps one
/// factor per dimension of any tensor; here a parameter of 3 or more dims is
/// one matrix, as the other whole-matrix optimizers take it.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <string>
#include <tuple>

#include "muon/optim/listed_fields.h"
#include "muon/optim/whole_matrix.h"

namespace muon {

/// Options of `muon::PsgdPro` (per parameter group), as chained setters,
/// with Emerging-Optimizers' names and defaults.
/// validate(): checks every field by its rule, and min_precond_lr <= precond_lr; raises c10::ValueError
/// "[muon::PsgdPro] <arg> must be ..., got <value>".
MUON_DEFINE_OPTIONS(PsgdProOptions, 3e-3,
                    /// Weight decay, >= 0, applied as `weight_decay_method` says.
                    (double, weight_decay, 0.01, rule::non_negative("weight decay")),
                    /// "decoupled", "independent" or "l2" (Emerging-Optimizers' WeightDecayMixin).
                    (std::string, weight_decay_method, "decoupled", rule::weight_decay_method()),
                    /// Decay of the gradient's EMA, in [0, 1).
                    (double, momentum, 0.9, rule::decay("decay of the gradient's EMA")),
                    /// EMA decay of the Lipschitz constants, in [0, 1).
                    (double, beta_lip, 0.9, rule::decay("EMA decay of the Lipschitz constants")),
                    /// The preconditioner's learning rate at step 0, > 0.
                    (double, precond_lr, 0.1, rule::positive("the preconditioner's lr at step 0")),
                    /// Scale of the initial factors (init_scale·I), > 0.
                    (double, precond_init_scale, 1.0, rule::positive("scale of the initial factors")),
                    /// Scale of the noise added to the momentum to fit the factors, >= 0.
                    (double, damping_noise_scale, 0.1,
                     rule::non_negative("scale of the noise the factors are fitted with")),
                    /// The floor of the preconditioner's learning rate, in [0, precond_lr].
                    (double, min_precond_lr, 0.01, rule::non_negative("floor of the preconditioner's lr")),
                    /// Steps of the preconditioner's learning rate schedule, >= 1.
                    (int64_t, warmup_steps, 10000,
                     rule::at_least("steps of the preconditioner lr's 1/sqrt schedule", 1)),
                    /// The update's RMS is clipped to this; 0: no clipping. >= 0.
                    (double, max_update_rms, 0.0, rule::non_negative("clip the update's RMS to this (0: no clipping)")),
                    /// Seed of the random draws, >= 0.
                    (int64_t, seed, 0, rule::non_negative("seed of the random draws")));

/// Per-parameter state of `muon::PsgdPro`, all of the whole matrix and held
/// by the process that steps it (the owner in the sharded layout), made by
/// the first step; Emerging-Optimizers' names (its lists Q and L as Q_L,
/// Q_R and lip_L, lip_R).
MUON_DEFINE_STATE(PsgdProParamState,
                  /// m, the gradient's EMA (m × n).
                  exp_avg,
                  /// The left factor (m × m).
                  Q_L,
                  /// The right factor (n × n).
                  Q_R,
                  /// The left factor's Lipschitz constant (a scalar tensor).
                  lip_L,
                  /// The right factor's Lipschitz constant (a scalar tensor).
                  lip_R);

namespace detail {

/// PSGD-Pro's step on one whole matrix's gradient `grad` (m × n; under l2
/// weight decay, G + wd·p): creates the state at its first step, counts the
/// step and returns the update u (the gradient's dtype), which the caller
/// applies after decoupled or independent weight decay as p ← p − lr·u.
/// Every layout runs it on whole matrices.
at::Tensor psgd_pro_update(const at::Tensor& grad, PsgdProParamState& state, const PsgdProOptions& options);

/// The seed of step `step`'s draws for an m × n matrix.
uint64_t psgd_pro_seed(const PsgdProOptions& options, int64_t rows, int64_t cols, int64_t step);

}  // namespace detail

/// PSGD-Pro: a `torch::optim::Optimizer` for parameters of at least 2 dims
/// (see the top of this header).
///
///     muon::PsgdPro opt(model->parameters(), muon::PsgdProOptions(3e-3));
MUON_DEFINE_WHOLE_MATRIX(PsgdPro, "psgd_pro");

}  // namespace muon
