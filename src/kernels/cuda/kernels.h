#pragma once
// The library's CUDA kernels (kernels.cu), launched on the caller's stream:
// plain pointers and sizes, no LibTorch, so that nvcc compiles them alone.
// Every launcher returns cudaSuccess or the launch's error code (an int).
// Internal.
#include <cstdint>

namespace muon::detail::cuda {

enum class Dtype : int { kFloat32 = 0, kBFloat16 = 1 };

/// For each of `batch` contiguous s×s matrices: out = U + U_strictᵀ +
/// shift·I, where U is the upper triangle of `upper` (fp32), rounded once
/// to out's dtype. With `complete_upper`, `upper` itself is made whole (its
/// lower triangle mirrored, its diagonal shifted), as the CPU's
/// symmetric_from_upper leaves it. out may be `upper` itself (fp32): then
/// only its lower triangle and diagonal are written.
int symmetrize(void* out, Dtype out_dtype, float* upper, int64_t batch, int64_t s, float shift,
               bool complete_upper, void* stream);

/// As symmetrize for a bf16 (b, s, s) tensor in place: its upper triangle
/// mirrored onto its lower one.
int mirror_bf16(void* data, int64_t batch, int64_t s, void* stream);

/// One matrix of a fused Muon batch: its gradient, momentum buffer and
/// parameter (contiguous fp32, `numel` elements each, all matrices of a
/// batch the same size), and its parameter's momentum rule and update.
struct MatrixSlot {
  const float* grad;
  float* buf;
  float* param;
  const void* orth;  // this matrix's Newton–Schulz output (decay_and_add)
  float mu;
  bool ema;       // buf ← buf + (1 − μ)(g − buf); else buf ← μ·buf + g
  bool nesterov;  // u = buf − (buf − g)(1 − μ) (ema) or g + μ·buf; else u = buf
  float decay;    // param ← param·decay + step·orth
  float step;
};

/// Blocks per matrix of `numel` elements in the fused passes (the entries
/// of `partials` per matrix).
int64_t chunks_per_matrix(int64_t numel);

/// Momentum on every matrix (slots: a device array of `matrices` slots),
/// buffers updated in place, and per block the sum of u² of its chunk in
/// fp64 into partials[m·chunks + c].
int momentum(const MatrixSlot* slots, int64_t matrices, int64_t numel, double* partials, void* stream);

/// X₀ of each matrix into x0 ((matrices, numel) contiguous, fp32 or bf16):
/// u recomputed from the gradient and the updated buffer, times the
/// normalization factor f = 1 / (‖u‖·safety + eps) (clamp: 1 / max(‖u‖·safety,
/// eps)) formed in fp64 from the matrix's partial sums (in a fixed order)
/// and rounded to fp32, u·f rounded once to x0's dtype.
int normalize(const MatrixSlot* slots, int64_t matrices, int64_t numel, const double* partials, double safety, double eps, bool clamp, void* x0,
              Dtype x0_dtype, void* stream);

/// param ← param·decay + step·orth for every matrix, with its slot's orth
/// (`numel` contiguous elements of orth_dtype), decay and step (fp32, as
/// the CPU pass rounds them).
int decay_and_add(const MatrixSlot* slots, int64_t matrices, int64_t numel, Dtype orth_dtype,
                  void* stream);

}  // namespace muon::detail::cuda
