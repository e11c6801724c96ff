#pragma once

/// Spectral clipping without an SVD: functions of a matrix's singular values
/// written with the matrix sign msign(X) = U·Vᵀ (X = U·Σ·Vᵀ), which
/// `muon::newton_schulz` computes. From Emerging-Optimizers'
/// emerging_optimizers/orthogonalized_optimizers/spectral_clipping_utils.py
/// (commit 319d2c6248602a81de26a2493856d29f9e1cd0eb), after
/// https://leloykun.github.io/ponder/spectral-clipping/:
///
///   spectral_clip(X, σmin, σmax)            = U·clamp(Σ, σmin, σmax)·Vᵀ
///     = ½[(σmin + σmax)·O + msign(σmin·I − O·Xᵀ)·(σmin·O − X)
///                         − msign(σmax·I − O·Xᵀ)·(σmax·O − X)],   O = msign(X)
///   spectral_hardcap(X, β)                  = U·min(Σ, β)·Vᵀ
///     = ½[β·O + X − (β·O − X)·msign(β·O − X)ᵀ·O]
///   spectral_clipped_weight_decay(X, β, c)  = (1 − c)·X + c·spectral_hardcap(X, β)
///     (singular values above β move a fraction c towards β; the rest stay)
///
/// Each msign is `newton_schulz` with Emerging-Optimizers' choice: the
/// polar_express coefficient set, 8 steps (other options at their
/// defaults), computed in fp64 for fp64 input and in fp32 otherwise. A wide
/// orientation is used (a tall X is transposed, then back), as there.
///
/// Accuracy is that of the Newton–Schulz polar factor: singular values of
/// X / ‖X‖_F (and of the inner matrices, whose singular values are the
/// distances |σᵢ − bound|) below ~1e-3 of their Frobenius norm are not
/// resolved by 8 polar_express steps, so values very near a bound are
/// clipped only approximately.
///
/// X: a matrix (m×n) or a batch (b×m×n) of independent matrices, floating
/// dtype; the result has X's shape and dtype. Invalid arguments raise
/// c10::ValueError naming the argument and its value.
#include <ATen/ATen.h>

namespace muon {

/// U·clamp(Σ, sigma_min, sigma_max)·Vᵀ; needs sigma_min ≤ sigma_max
/// (Emerging-Optimizers' defaults: −1, 1).
at::Tensor spectral_clip(const at::Tensor& x, double sigma_min = -1.0, double sigma_max = 1.0);

/// U·min(Σ, beta)·Vᵀ; needs beta ≥ 0 (default 1).
at::Tensor spectral_hardcap(const at::Tensor& x, double beta = 1.0);

/// (1 − c)·X + c·spectral_hardcap(X, beta); needs beta ≥ 0 and c in [0, 1]
/// (defaults 1 and 0.5).
at::Tensor spectral_clipped_weight_decay(const at::Tensor& x, double beta = 1.0, double c = 0.5);

}  // namespace muon
