#pragma once

/// Dion on `torch::optim`: low-rank orthonormalized updates by power
/// iteration with error feedback (Ahn et al. 2025, "Dion: Distributed
/// Orthonormalized Updates", arXiv:2504.05295), with the arithmetic and
/// defaults of microsoft/dion (dion/dion.py, dion/dion_reference.py at
/// commit 0a059a4542e5aa74b40dcd1dce363836c7afcd48).
///
/// A parameter X of rows m and cols n (one matrix: dim 0 × the product of the
/// others, as muon::Soap sees it) keeps a momentum M (m × n) and a right
/// factor Q (min(m, n) × r), r = min(rank_multiple_of·⌈rank_fraction·min(m,n) /
/// rank_multiple_of⌉, m, n). B is M when m >= n, else Mᵀ (B tall, n' its
/// columns). One step with gradient G:
///
///   1. M ← M + G                                  (no decay here)
///   2. power_iters times: P = orth(B·Q); Q ← Bᵀ·P  (R = the last Bᵀ·P)
///   3. B all zero: P ← 0, R ← Q (the old Q); else NaNs of P and R → 0
///   4. M ← M − (1 − mu)·P·Rᵀ (transposed back)      (error feedback)
///   5. Q ← R / (‖R[:, j]‖₂ + epsilon)             (column norms, fp32)
///   6. X ← X·(1 − lr·weight_decay) − lr·√(m/n)·P·Qᵀ (transposed back)
///
/// orth(P) of P (m' × r), in fp32 (fp64 for fp64 parameters): Householder QR
/// when m' <= r or `qr_method` is "qr"; otherwise ("rcqr", Dion's default)
/// randomized Cholesky QR: S (k × m', k = 128·⌈rcqr_oversample·r/128⌉) of
/// N(0, 1/k) entries, R₁ = qr(S·P).R, P ← P·R₁⁻¹, then R₂ = chol(PᵀP) (upper),
/// P ← P·R₂⁻¹. In exact arithmetic both give P's orthonormal basis up to
/// the sign of each column, which step 6 does not see (P·Qᵀ keeps its sign).
///
/// Randomness: Q starts as N(0, 1) entries and RCQR draws S every step,
/// both from a CPU generator seeded by (seed, m, n) and, for S, the step and
/// the power iteration: a pure function of the options and the whole
/// matrix's shape, so every layout and device draws what one process does
/// (Dion draws from the global generator and broadcasts Q).
///
/// Deviations from Dion: parameters of 3 or more dims are stepped as one
/// matrix (Dion refuses them); the generator above; Dion's `cqr` method
/// (Cholesky QR falling back to RCQR) is not offered. 1-D, embedding and
/// head parameters go to the scalar optimizer (Dion's param groups with
/// algorithm "adamw" or "lion"): the registry entry routes them.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <functional>
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

/// Most power iterations one Dion step takes (each draw's seed counts on it).
inline constexpr int64_t kDionMaxPowerIters = 16;

/// Options of `muon::Dion` (per parameter group), as chained setters, with
/// Dion's names and defaults.
/// validate(): checks every field by its rule; raises c10::ValueError "[muon::Dion] <arg> must be ..., got <value>".
MUON_DEFINE_OPTIONS(DionOptions, 0.01,
                    /// Error-feedback decay: M ← M − (1 − mu)·P·Rᵀ, in [0, 1].
                    (double, mu, 0.95, rule::in("error-feedback decay: M -= (1 - mu)·P·Rᵀ", 0, 1)),
                    /// Rank r as a fraction of min(rows, cols), in (0, 1].
                    (double, rank_fraction, 1.0, rule::in("rank r as a fraction of min(rows, cols)", 0, 1).open_min()),
                    /// r rounded up to a multiple of this, >= 1 (then capped at min(rows, cols)).
                    (int64_t, rank_multiple_of, 1, rule::at_least("r rounded up to a multiple of this", 1)),
                    /// Decoupled weight decay X ← X·(1 − lr·weight_decay), >= 0.
                    (double, weight_decay, 0.01, rule::non_negative("decoupled weight decay")),
                    /// Column normalization epsilon, > 0.
                    (double, epsilon, 1e-8, rule::positive("column normalization epsilon")),
                    /// Power iterations per step, in [1, 16].
                    (int64_t, power_iters, 1, rule::in("power iterations per step", 1, kDionMaxPowerIters)),
                    /// "rcqr" (randomized Cholesky QR, Dion's) | "qr" (Householder).
                    (std::string, qr_method, "rcqr",
                     rule::one_of("rcqr (randomized Cholesky QR) | qr (Householder)", "rcqr|qr")),
                    /// RCQR's sketch oversampling, in [1, 8].
                    (double, rcqr_oversample, 1.25, rule::in("RCQR's sketch oversampling", 1, 8)),
                    /// Seed of Q's start and RCQR's sketches, >= 0.
                    (int64_t, seed, 0, rule::non_negative("seed of Q's start and RCQR's sketches")));

/// Per-parameter state of `muon::Dion`: `momentum` M (the parameter's shape
/// and dtype, split with its rows in the sharded layout) and the right
/// factor `Q` (min(rows, cols) × r of the whole matrix, the parameter's
/// dtype), held whole by one process (the matrix's owner in the sharded layout).
MUON_DEFINE_STATE(DionParamState,
                  /// M, with error feedback.
                  momentum,
                  /// Q, the normalized right factor of the last step (N(0, 1) at first).
                  Q);

namespace detail {

/// Dion's rank r for a rows × cols matrix.
int64_t dion_rank(int64_t rows, int64_t cols, const DionOptions& options);
/// Q's start for a rows × cols matrix: N(0, 1) entries, min(rows, cols) × r,
/// in `options`' dtype and device (drawn on the CPU from the seed).
at::Tensor dion_initial_q(int64_t rows, int64_t cols, const DionOptions& o,
                          const at::TensorOptions& options);
/// The seed of RCQR's sketch at `step` (1-based) and power `iteration` of a rows × cols matrix.
uint64_t dion_sketch_seed(const DionOptions& o, int64_t rows, int64_t cols, int64_t step, int64_t iteration);
/// Q ← R with unit columns (step 5), R's NaNs as 0, and `q_old` where `zero`
/// (a bool scalar: B is all zero), in `dtype`.
at::Tensor dion_next_q(const at::Tensor& r, const at::Tensor& q_old, const at::Tensor& zero, const DionOptions& o,
                       at::ScalarType dtype);
/// orth(P) as the top of this header says (fp32, fp64 for fp64 P), in P's dtype;
/// `draw` seeds RCQR's sketch.
at::Tensor dion_orthogonalize(const at::Tensor& p, const DionOptions& o, uint64_t draw);
/// Dion's step on one whole matrix `grad` (rows × cols), steps 1–5 of the
/// top of this header, on `state`'s momentum (of rows·cols elements, made
/// by the caller) and Q (drawn at the first step); returns the
/// update U = P·Qᵀ (rows × cols; X ← X·(1 − lr·wd) − lr·√(rows/cols)·U is
/// the rest). Every layout runs it on whole matrices.
at::Tensor dion_matrix_update(const at::Tensor& grad, DionParamState& state,
                              const DionOptions& options);

}  // namespace detail

/// Dion: a `torch::optim::Optimizer` for parameters of at least 2 dims
/// (see the top of this header).
///
///     muon::Dion opt(model->parameters(), muon::DionOptions(0.01).rank_fraction(0.25));
///
/// `save`/`load` in LibTorch's optimizer archive layout with the options
/// beside it; an archive of another optimizer is refused.
class Dion : public WholeMatrixOptimizer<Dion, DionOptions, DionParamState> {
 public:
  using WholeMatrixOptimizer::WholeMatrixOptimizer;

  /// Messages say "[muon::Dion] ..."; archive keys "dion_groups", "dion_options/<i>", ...
  static constexpr OptimizerNames kNames{"muon::Dion", "dion"};
  /// Q's shape for `param` (min(rows, cols) × r of its whole matrix, r by its group's options).
  std::vector<int64_t> q_shape(const at::Tensor& param) const;

 protected:
  /// Steps every parameter with a gradient (after the step's checks).
  void step_parameters() override;

  /// The update U of one parameter (its elements, any shape) from its state
  /// (momentum made), options and whole matrix's rows and cols.
  using MatrixUpdate =
      std::function<at::Tensor(const at::Tensor& param, DionParamState&, const DionOptions&, int64_t, int64_t)>;
  /// Every parameter with a gradient: its state made, U = `update`, then
  /// X ← X·(1 − lr·weight_decay) − lr·√(rows/cols)·U (step 6 of the top of this header).
  void step_matrices(const MatrixUpdate& update);
};

}  // namespace muon
