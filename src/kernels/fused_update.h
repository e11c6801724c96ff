#pragma once
// One-pass elementwise parts of the Muon step on contiguous CPU fp32
// tensors: momentum with Nesterov, the normalized Newton–Schulz input
// written straight into the compute dtype, and the weight-decayed update;
// and the library's one fp64 sum of squares, which those passes share.
// Internal.
#include <ATen/ATen.h>

#include <cstdint>

namespace muon::detail {

/// The momentum rule and the tensor handed to Newton–Schulz.
struct MomentumRule {
  double mu = 0.95;
  bool ema = true;       // buf ← buf + (1 − μ)(g − buf); else buf ← μ·buf + g
  bool nesterov = true;  // u = g + μ(buf − g) (ema) or g + μ·buf; else u = buf
};

/// Whether `t` is a contiguous CPU fp32 tensor (what the fused passes take).
bool fused_eligible(const at::Tensor& t);

/// Updates `buf` in place from `grad` (both contiguous CPU fp32, same numel,
/// holding `matrices` equal contiguous matrices) and writes, per matrix,
/// Σ u² of the update u into `sumsq` (fp64, `matrices` entries).
void momentum_pass(at::Tensor& buf, const at::Tensor& grad, const MomentumRule& rule,
                   int64_t matrices, double* sumsq);

/// The momentum rule on contiguous CPU fp32 tensors in one pass: updates
/// `buf` from `grad` and, with Nesterov and `update` given, sets *update to
/// a new tensor holding u. Elementwise the same arithmetic as momentum_pass.
void momentum_step(at::Tensor& buf, const at::Tensor& grad, const MomentumRule& rule,
                   at::Tensor* update);

/// Σ x² of any floating tensor, carried in fp64: the sum behind every
/// Frobenius norm of the library (newton_schulz's normalization, on one
/// process or split over many, and the fused Muon step). A contiguous CPU
/// fp32 tensor is summed as momentum_pass sums u² (the same values give the
/// same sum, to the bit); contiguous CPU fp64 through the BLAS's ddot;
/// anything else through LibTorch's fp64 norm.
double sum_of_squares(const at::Tensor& x);

/// out[i] = u[i]·scale[matrix of i], u recomputed from grad and the updated
/// buf as momentum_pass defines it, rounded once to out's dtype (fp32 or
/// bf16; contiguous CPU, same numel).
void normalized_update(at::Tensor& out, const at::Tensor& buf, const at::Tensor& grad,
                       const MomentumRule& rule, int64_t matrices, const double* scale);

/// param ← param·decay + step·orth, in one pass; param contiguous CPU fp32,
/// orth contiguous CPU fp32 or bf16 with the same numel.
void decay_and_add(at::Tensor& param, const at::Tensor& orth, double decay, double step);

}  // namespace muon::detail
