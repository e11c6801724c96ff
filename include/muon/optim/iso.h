#pragma once

/// Iso, the isospectral optimizer, on `torch::optim`, with the arithmetic
/// and defaults of Emerging-Optimizers (emerging_optimizers/
/// riemannian_optimizers/isospectral.py at commit fd77292; "ISO: An
/// RLVR-Native Optimization Stack", arXiv:2607.19331).
///
/// Iso keeps each matrix X (rows m × cols n; a parameter of 3 or more dims
/// is one matrix, dim 0 × the product of the others) as U·diag(σ)·Vᵀ, from
/// the SVD of X at its first step (k = min(m, n)), and moves the Stiefel
/// factors U (m × k) and V (n × k) while σ stays fixed. One step with
/// gradient G:
///
///   gU = (G·V)·diag(σ),  gV = (Gᵀ·U)·diag(σ)   (no tangent projection)
///   Mu ← momentum·Mu + gU,  Mv ← momentum·Mv + gV   (heavy ball)
///   U ← retract(U, Mu),  V ← retract(V, Mv)
///   X ← U·diag(σ)·Vᵀ                           (overwrites X)
///
/// retract(Y, M), with Z = Y − lr·M: "qr" (default) the Q of Z's QR with
/// each column's sign that of R's diagonal (0 as +1); "polar" U·Vᵀ of Z's
/// SVD; "cayley" solve(I − ½lr·S, (I + ½lr·S)·Y) with S = D·Yᵀ − Y·Dᵀ, D = −M.
/// Iso has no weight decay. Since X is rebuilt from the factors, an edit of
/// X between steps is lost at the next step (Emerging-Optimizers' behavior).
///
/// The factors and momenta are fp32 (fp64 for fp64 parameters; Emerging-
/// Optimizers keeps them fp32 always). An SVD's singular vectors are defined
/// up to a sign per pair (u_j, v_j), which X = U·diag(σ)·Vᵀ and every later
/// step carry along unseen.
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

/// Options of `muon::Iso` (per parameter group), as chained setters, with
/// Emerging-Optimizers' names and defaults.
/// validate(): checks every field by its rule, and weight_decay is 0; raises c10::ValueError "[muon::Iso] <arg> must be
/// ..., got <value>".
MUON_DEFINE_OPTIONS(IsoOptions, 1e-3,
                    /// Heavy-ball momentum of the factors' gradients, in [0, 1).
                    (double, momentum, 0.9, rule::decay("heavy-ball momentum of the factors' gradients")),
                    /// "qr" | "polar" | "cayley".
                    (std::string, retraction, "qr", rule::one_of("qr | polar | cayley", "qr|polar|cayley")),
                    /// Iso has no weight decay: must be 0 (the registry's common field).
                    (double, weight_decay, 0.0, rule::non_negative("none: Iso keeps the singular values")));

/// Per-parameter state of `muon::Iso`, all of the whole matrix and held by
/// the process that steps it (the owner in the sharded layout), made by the
/// first step: `u` (m × k), `sigma` (k), `v` (n × k), `momentum_u`,
/// `momentum_v`.
MUON_DEFINE_STATE(IsoParamState,
                  /// U, the left Stiefel factor.
                  u,
                  /// σ, the singular values (fixed).
                  sigma,
                  /// V, the right Stiefel factor.
                  v,
                  /// Mu, U's momentum.
                  momentum_u,
                  /// Mv, V's momentum.
                  momentum_v);

namespace detail {

/// Iso's step on one whole matrix: `param` (m × n, read at the first step
/// for the SVD) and `grad`; creates the state at its first step and returns
/// the new values of X (m × n, the gradient's dtype). Every layout runs it
/// on whole matrices.
at::Tensor iso_matrix_update(const at::Tensor& param, const at::Tensor& grad, IsoParamState& state,
                             const IsoOptions& options);

}  // namespace detail

/// Iso: a `torch::optim::Optimizer` for parameters of at least 2 dims (see
/// the top of this header).
///
///     muon::Iso opt(model->parameters(), muon::IsoOptions(1e-3).retraction("cayley"));
MUON_DEFINE_WHOLE_MATRIX(Iso, "iso");

}  // namespace muon
