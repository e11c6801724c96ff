#pragma once

/// MOSO (Momentum One-Sided SOAP) on `torch::optim`, with the arithmetic
/// and defaults of NVIDIA-NeMo/Emerging-Optimizers (emerging_optimizers/
/// legacy_soap/moso.py at commit fd77292, registered as "moso"; its
/// eigenbases by utils/eig.py's eigh_with_fallback and orthogonal_iteration).
///
/// MOSO keeps Muon's momentum B of each matrix (rows m × cols n; a
/// parameter of 3 or more dims is one matrix, dim 0 × the product of the
/// others), a covariance of B on its smaller side (s = min(m, n)) and that
/// covariance's eigenbasis Q, and steps by RMSprop in the eigenbasis. One
/// step t (1-based) with gradient G, "left" meaning m ≤ n:
///
///   p ← p − lr·wd·p                               (decoupled weight decay)
///   B ← B + (1 − momentum)·(G − B)
///   β' = 1 − (1 − shampoo_beta) / (1 − shampoo_beta^t)
///   M ← M + (1 − β')·(B·Bᵀ − M)       (left; Bᵀ·B otherwise; s × s)
///   Q ← eigh(M) at t = 1, by descending eigenvalue (fp64 if fp32 fails);
///       later one orthogonal iteration, Q ← qr(M·Q).Q, whose columns are
///       then sorted by descending diag(Qᵀ·M·Q)
///   X = Qᵀ·B (left; B·Q otherwise)
///   v ← v + (1 − rms_beta)·(X² − v);  U = X / (√v + eps)   (no bias correction)
///   u = Q·U (left; U·Qᵀ otherwise)
///   u ← u·min(1, max_update_rms / (rms(u) + 1e-7))  (when max_update_rms > 0)
///   p ← p − lr·u
///
/// v stays where it is when Q's columns are re-sorted (Emerging-Optimizers'
/// arithmetic since its change #274), and B is never rotated. The state is
/// fp32 (fp64 for fp64 parameters), as Emerging-Optimizers keeps it fp32.
/// Emerging-Optimizers accepts 2-D parameters only and fixes weight decay
/// as decoupled; this class also steps parameters of 3 or more dims.
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

/// Options of `muon::Moso` (per parameter group), as chained setters, with
/// Emerging-Optimizers' names and defaults.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::Moso] <arg> must be ..., got <value>".
MUON_DEFINE_OPTIONS(MosoOptions, 3e-4,
                    /// Decay of Muon's momentum B, in [0, 1).
                    (double, momentum, 0.95, rule::decay("decay of Muon's momentum")),
                    /// Decay of RMSprop's second moment in the eigenbasis, in [0, 1).
                    (double, rms_beta, 0.95, rule::decay("decay of RMSprop's second moment")),
                    /// Decay of the covariance M (bias-corrected), in [0, 1).
                    (double, shampoo_beta, 0.95, rule::decay("decay of the covariance (bias-corrected)")),
                    /// Added to √v, > 0.
                    (double, eps, 1e-8, rule::positive("added to RMSprop's √v")),
                    /// Decoupled weight decay, >= 0.
                    (double, weight_decay, 0.01, rule::non_negative("decoupled weight decay")),
                    /// The update's RMS is clipped to this; 0: no clipping. >= 0.
                    (double, max_update_rms, 0.0,
                     rule::non_negative("clip the update's RMS to this (0: no clipping)")));

/// Per-parameter state of `muon::Moso`, all of the whole matrix and held by
/// the process that steps it (the owner in the sharded layout), made by the
/// first step; Emerging-Optimizers' names.
MUON_DEFINE_STATE(MosoParamState,
                  /// B, Muon's momentum (m × n).
                  momentum_buffer,
                  /// v, RMSprop's second moment in the eigenbasis (m × n).
                  exp_avg_sq,
                  /// M, the smaller side's covariance of B (s × s).
                  M,
                  /// Q, M's eigenbasis (s × s), columns by descending eigenvalue.
                  Q_M);

namespace detail {

/// MOSO's step on one whole matrix's gradient `grad` (m × n): creates the
/// state at its first step, counts the step and returns the update u (the
/// gradient's dtype), which the caller applies after weight decay as
/// p ← p − lr·wd·p − lr·u. Every layout runs it on whole matrices.
at::Tensor moso_matrix_update(const at::Tensor& grad, MosoParamState& state, const MosoOptions& options);

}  // namespace detail

/// MOSO: a `torch::optim::Optimizer` for parameters of at least 2 dims (see
/// the top of this header).
///
///     muon::Moso opt(model->parameters(), muon::MosoOptions(3e-4).max_update_rms(1.0));
MUON_DEFINE_WHOLE_MATRIX(Moso, "moso");

}  // namespace muon
