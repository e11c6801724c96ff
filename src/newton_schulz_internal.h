#pragma once
// Newton–Schulz entries for callers that normalize the input themselves or
// hold only part of the matrix. Internal.
#include <ATen/ATen.h>

#include "muon/newton_schulz.h"

namespace muon::detail {

/// Completes the two sums Newton–Schulz takes over a whole matrix when each
/// process holds only a block of it: ‖G‖²_F for the normalization and the
/// Gram matrix of the unsplit side in every step. Each process forms its
/// partial sum and the reduction adds those of every process in place
/// (an all-reduce over the group). One process passes none: the sums are
/// already whole. A process whose block is empty still calls both, with
/// zeros, so that every process joins every reduction.
class PartialSums {
 public:
  virtual ~PartialSums() = default;
  /// Σ x² of this process's block in, Σ x² of the whole matrix out (fp64).
  virtual void reduce_sum_of_squares(double& sumsq) const = 0;
  /// This process's Gram matrix (1, s, s) in, the whole matrix's out. Only
  /// its upper triangle may be defined: the sum is taken elementwise and
  /// the iteration reads back what it wrote.
  virtual void reduce_gram(at::Tensor& gram) const = 0;
};

/// The iterations of muon::newton_schulz on x0 = G·normalization_factor
/// per matrix, already formed: x0 is a contiguous (b, m, n) tensor in the
/// compute dtype, and the options are valid. Returns the orthogonalized
/// (b, m, n) tensor in the compute dtype.
at::Tensor newton_schulz_normalized(at::Tensor x0, const NewtonSchulzOptions& options);

/// Of muon::newton_schulz_executed_flops, the FLOPs of products that run
/// in fp32 although the compute dtype is 16-bit (Gram's s×s state); 0 for
/// other methods and dtypes. Benchmarks divide them by the fp32 rate.
double executed_fp32_state_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options);

/// The factor X₀ = G·f that normalizes a matrix with Σ G² = `sum_of_squares`
/// under `options`: f = 1 / (‖G‖_F·safety + eps) (eps_mode add) or
/// f = 1 / max(‖G‖_F·safety, eps) (eps_mode clamp). Every path that
/// normalizes on the CPU (muon::newton_schulz, the distributed iteration,
/// Muon's fused step) takes it from here.
double normalization_factor(double sum_of_squares, const NewtonSchulzOptions& options);

/// X₀ = G·normalization_factor(Σ G²) per matrix of a (b, m, n) tensor, as a new
/// contiguous tensor in the compute dtype (the normalization of
/// muon::newton_schulz). With `sums`, each matrix is a block of a larger
/// one and ‖G‖²_F is completed by sums->reduce_sum_of_squares.
at::Tensor newton_schulz_input(const at::Tensor& x3, const NewtonSchulzOptions& options,
                               const PartialSums* sums = nullptr);

/// The standard method's iterations on x0 (as newton_schulz_normalized),
/// iterating on the Gram matrix of the columns (XᵀX, applied on the right)
/// when `columns`, else of the rows (XXᵀ, on the left), whatever the shape.
/// With `sums`, x0 is one (1, m, n) block of a matrix split along the other
/// side (m or n may be 0), and every Gram matrix is completed by
/// sums->reduce_gram before use; 16-bit compute then forms it in fp32.
at::Tensor standard_newton_schulz(at::Tensor x0, const NewtonSchulzOptions& options,
                                  bool columns, const PartialSums* sums = nullptr);

}  // namespace muon::detail
