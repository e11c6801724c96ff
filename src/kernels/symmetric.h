#pragma once
// Symmetric products for Newton–Schulz. Internal.
#include <ATen/ATen.h>

namespace muon::detail {

/// out = beta·out + alpha·op(X)·op(X)ᵀ for every matrix of a batch, with the
/// full symmetric result written (both triangles).
///   x:   (b, s, l) when !trans (op(X) = X), (b, l, s) when trans (op(X) = Xᵀ)
///   out: (b, s, s), contiguous, same dtype/device as x
/// `symmetric_kernels` selects SYRK (CBLAS) or blocked GEMMs over the upper
/// block triangle; false runs one full GEMM (the plain formula).
void syrk(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta,
          bool symmetric_kernels);

/// out = a·b for batches of matrices (one GEMM per matrix on CPU).
void batched_mm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

/// out = beta·c + alpha·a·b for batches of matrices (out must not alias a
/// or b; one GEMM per matrix on CPU).
void batched_addmm_out(at::Tensor& out, const at::Tensor& c, const at::Tensor& a,
                       const at::Tensor& b, double beta, double alpha);

/// beta·c + alpha·a·b for batches of matrices, as a new tensor (one GEMM
/// per matrix on CPU, baddbmm elsewhere).
at::Tensor batched_addmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                         double beta, double alpha);

/// CBLAS backend (src/kernels/cblas_syrk.cpp or cblas_none.cpp): handles
/// contiguous CPU float/double inputs and returns true, or returns false.
bool cblas_syrk(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta);

/// Σ x² of a contiguous CPU float/double tensor, accumulated in fp64
/// (cblas_dsdot / cblas_ddot); false when the backend cannot take it.
bool cblas_sum_of_squares(const at::Tensor& x, double* out);

/// Copies the upper triangle of every (contiguous, square) matrix of a
/// (b, s, s) tensor onto its lower triangle.
void mirror_upper_to_lower(at::Tensor& out);

}  // namespace muon::detail
