#pragma once
// The GPU's kernels behind Newton–Schulz and Muon's fused step, for CUDA
// tensors: cuBLAS products (16-bit inputs on the tensor cores with fp32
// sums), symmetric products as the upper triangle of equal tiles in one
// batched call, a tiled mirror, and Muon's element-wise passes as three
// kernels per batch. Built from src/kernels/cuda/ when MUON_CUDA is on
// (a CUDA LibTorch and a CUDA compiler); otherwise from cuda_none.cpp,
// where every entry reports that it cannot take the case. Internal.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace muon::detail {

/// Whether this build has the CUDA kernels.
bool cuda_kernels_built();

/// out = beta·out + alpha·a·b for batches (3-D) of CUDA matrices through
/// cuBLAS: a and b of one dtype (fp32, bf16, fp16 or fp64), each with a
/// unit stride in one of its last two dimensions; out of their dtype or
/// fp32, row-major with any leading dimension (a block of a larger
/// matrix). Sums in fp32 (fp64 for fp64) and no reduced-precision
/// reductions; one rounding to out's dtype. Returns false, touching
/// nothing, where it cannot take the case.
bool cuda_matmul(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                 double beta);

/// The upper block triangle of out = beta·out + alpha·op(X)·op(X)ᵀ
/// (op(X) = X, or Xᵀ when `trans`) for CUDA (b, s, s) `out`: the s×s
/// result as k×k equal tiles of which the k(k + 1)/2 on or above the
/// diagonal are computed, in one batched cuBLAS call. False when s has no
/// such tiling (cuda_tiles(s) == 1) or the case is not CUDA's.
bool cuda_syrk_upper(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta);

/// As cuda_syrk_upper for out = beta·out + alpha·a·b where a·b is known to
/// be symmetric (a and b commute: polynomials in one matrix).
bool cuda_commuting_upper(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                          double alpha, double beta);

/// The current CUDA stream of `device` (a cudaStream_t): where every kernel
/// and product of these entries runs, as LibTorch's own operations do.
void* cuda_current_stream(const at::Device& device);

/// Tiles per side of a symmetric s×s product on CUDA (1: one full product).
int64_t cuda_tiles(int64_t s);

/// out = U + U_strictᵀ + shift·I per matrix, U the upper triangle of the
/// contiguous fp32 CUDA (b, s, s) `upper`, which is left whole (mirrored,
/// shifted); out (contiguous, fp32 or bf16) may be upper itself. False
/// where the case is not CUDA's.
bool cuda_symmetrize(at::Tensor& out, at::Tensor& upper, double shift);

/// Mirrors the upper triangle of a contiguous CUDA (b, s, s) fp32 or bf16
/// tensor onto its lower one, in place. False where the case is not CUDA's.
bool cuda_mirror(at::Tensor& t);

/// One parameter of a fused Muon batch on the GPU: contiguous fp32 CUDA
/// tensors of one device, `matrices` equal matrices each.
struct CudaFusedItem {
  at::Tensor grad, buf, param, orth;  // orth: set after Newton–Schulz
  int64_t matrices = 1;
  double mu = 0.95;
  bool ema = true;
  bool nesterov = true;
  double decay = 1.0;  // param ← param·decay + step·orth
  double step = 0.0;
};

/// Whether `t` is a tensor the fused GPU passes take (contiguous CUDA fp32,
/// in a build with the CUDA kernels).
bool cuda_fused_eligible(const at::Tensor& t);

/// Momentum on every item's buffer and the normalized Newton–Schulz input
/// of every matrix into x0 ((Σ matrices, rows, cols) contiguous, fp32 or
/// bf16), in two kernels and no host synchronization: the normalization
/// f = 1 / (‖u‖·safety + eps) (clamp: 1 / max(‖u‖·safety, eps)).
void cuda_fused_momentum(const std::vector<CudaFusedItem>& items, at::Tensor& x0, double safety,
                         double eps, bool clamp);

/// param ← param·decay + step·orth for every item, in one kernel.
void cuda_fused_apply(const std::vector<CudaFusedItem>& items);

}  // namespace muon::detail
