#pragma once
// Symmetric products for Newton–Schulz. Internal.
#include <ATen/ATen.h>

#include <string>

namespace muon::detail {

/// out = beta·out + alpha·op(X)·op(X)ᵀ for every matrix of a batch, with the
/// full symmetric result written (both triangles).
///   x:   (b, s, l) when !trans (op(X) = X), (b, l, s) when trans (op(X) = Xᵀ)
///   out: (b, s, s), contiguous, same device as x; same dtype, or fp32 for a
///        bf16 x where accumulates_in_fp32(x) (exact products summed in fp32)
/// `symmetric_kernels` selects SYRK (CBLAS) or blocked GEMMs over the upper
/// block triangle; false runs one full GEMM (the plain formula).
void syrk(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta,
          bool symmetric_kernels);

/// As syrk with symmetric kernels, but only the upper triangle of out is
/// defined afterwards (the lower one is left as it was or overwritten).
/// Returns true when the kernel made out whole anyway (CBLAS SYRK
/// mirrors), so that callers can skip mirroring it again.
bool syrk_upper(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta);

/// out = U + U_strictᵀ + shift·I for every matrix of a batch, where U is
/// the upper triangle of `upper` (contiguous (b, s, s)), rounded once to
/// out's dtype. `upper` is left holding the full fp32 result.
void symmetric_from_upper(at::Tensor& out, at::Tensor& upper, double shift);

/// out = beta·c + alpha·a·b for batches of symmetric matrices a, b that
/// commute (polynomials in one matrix), so that a·b is symmetric: only the
/// upper block triangle is computed (row panels, as in syrk), then mirrored.
/// out must not alias a or b; c may be out itself.
void commuting_addmm_out(at::Tensor& out, const at::Tensor& c, const at::Tensor& a,
                         const at::Tensor& b, double beta, double alpha);

/// The share of a full GEMM's FLOPs that a symmetric s×s product on CPU
/// with inputs of `dtype` performs: 1/2 for a CBLAS SYRK (`gram`: X·Xᵀ or
/// A·A through syrk), (k + 1)/(2k) for k row panels of the upper triangle
/// (oneDNN, ATen), 1 for a single panel (small s).
double symmetric_product_fraction(int64_t s, at::ScalarType dtype, bool gram);

/// While alive on this thread, products serve a 16-bit computation: CPU
/// products of every dtype run on LibTorch's intra-op threads (as
/// LibTorch's own bf16 matmul does; its fp32 matmul runs on the BLAS's
/// threads), and fp32 products (the s×s state of 16-bit Gram iterations)
/// sum K in one pass: their fp32 rounding is far below the iterate's 2⁻⁹.
class SixteenBitCompute {
 public:
  SixteenBitCompute();
  ~SixteenBitCompute();
  SixteenBitCompute(const SixteenBitCompute&) = delete;
  SixteenBitCompute& operator=(const SixteenBitCompute&) = delete;

 private:
  bool previous_;
};

/// For work the caller already spreads over threads (one matrix per
/// thread): while alive, this thread's CPU products, oneDNN primitives and
/// LibTorch intra-op loops run on this thread alone. OpenMP's thread count
/// is per thread, so other threads keep theirs.
class OneThreadScope {
 public:
  OneThreadScope();
  ~OneThreadScope();
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  bool previous_;
  int previous_threads_;
};

/// Whether CPU products with inputs of `dtype` all run on oneDNN primitives
/// (no BLAS with its own thread pool), so OneThreadScope holds them to one
/// thread.
bool products_follow_thread_scope(at::ScalarType dtype);

/// Sets the calling thread's OpenMP thread count and returns the previous
/// one (the oneDNN backend's OpenMP; without it, returns n and does nothing).
int exchange_omp_threads(int n);

/// out = a·b for batches of matrices (one GEMM per matrix on CPU).
void batched_mm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

/// out = beta·c + alpha·a·b for batches of matrices (out must not alias a
/// or b; one GEMM per matrix on CPU).
void batched_addmm_out(at::Tensor& out, const at::Tensor& c, const at::Tensor& a,
                       const at::Tensor& b, double beta, double alpha);

/// CBLAS backend (src/kernels/cblas_syrk.cpp or cblas_none.cpp): handles
/// contiguous CPU float/double inputs and returns true, or returns false.
bool cblas_syrk(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta);

/// Σ x² of a contiguous CPU fp64 tensor (cblas_ddot), the fp64 case of
/// sum_of_squares (kernels/fused_update.h); false when the backend cannot
/// take it.
bool cblas_sum_of_squares(const at::Tensor& x, double* out);

/// Whether products of x's dtype on x's device can write fp32 results from
/// bf16 inputs: every CPU bf16 product (oneDNN's bf16 matmul, or fp32
/// products of the exactly widened operands where oneDNN has none).
bool accumulates_in_fp32(const at::Tensor& x);

/// How CPU products with bf16 inputs run.
enum class Bf16Products {
  kOneDnn,  ///< oneDNN's bf16 matmul: exact products summed in fp32
  kWidened, ///< operands widened to fp32 (exactly), fp32 products (oneDNN or
            ///< the BLAS), the result rounded once: the same arithmetic
};
/// kOneDnn where oneDNN has a native bf16 matmul on this CPU (under
/// ONEDNN_MAX_CPU_ISA; dnnl_bf16_available), else kWidened.
Bf16Products bf16_products();

/// One line naming the kernels CPU products with inputs of `dtype` (kFloat
/// or kBFloat16) run on, and why: what `explain` and the benchmarks print.
std::string describe_cpu_products(at::ScalarType dtype);

/// oneDNN backend (src/kernels/dnnl_matmul.cpp or dnnl_none.cpp).
bool dnnl_matmul_available();

/// Whether oneDNN has a native bf16 matmul on this CPU under
/// ONEDNN_MAX_CPU_ISA (AVX512_CORE_BF16 or AMX; AVX2_VNNI_2 in oneDNN 3):
/// none on AVX2, and at AVX512_CORE its emulated one is slower than the
/// widened fp32 products. Probed once.
bool dnnl_bf16_available();

/// oneDNN's effective ISA, as ONEDNN_MAX_CPU_ISA names it ("AVX2",
/// "AVX512_CORE_BF16", ...); "" without oneDNN.
std::string dnnl_isa_name();

/// out = beta·out + alpha·a·b for CPU matrices (2-D) or batches of them
/// (3-D, one primitive for the whole batch) through oneDNN's matmul,
/// on `threads` OpenMP threads. a and b: both fp32 or both bf16, each with
/// one unit stride; out: fp32, or bf16 for bf16 inputs, row-major with any
/// leading dimension (a block of a larger matrix). beta·out + alpha·a·b is
/// summed in fp32 and rounded once to out's dtype.
/// fp32 products sum K in chunks of 128 unless `chunk_fp32_k` is false.
/// Returns false, touching nothing, when it cannot take the case.
bool dnnl_matmul(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                 double beta, int threads, bool chunk_fp32_k = true);

/// Whether oneDNN runs AVX-512 kernels on this CPU.
bool dnnl_has_avx512();

/// The system BLAS's own thread count (OpenBLAS), or 0 when unknown.
int blas_num_threads();

/// The kernel family OpenBLAS runs ("Haswell", "SkylakeX", ...), or "".
std::string blas_core_name();

/// Whether CPU fp32 products go to oneDNN rather than the BLAS: when the
/// CPU has AVX-512 and OpenBLAS does not use it (it runs AVX2 kernels on
/// CPUs it does not know, or when OPENBLAS_CORETYPE says so), oneDNN's
/// fp32 GEMM is ~2× faster per core; otherwise the BLAS's SYRK does half
/// the work of a panelled product. MUON_FP32_PRODUCTS=blas|onednn overrides.
bool fp32_products_on_dnnl();

/// Rounds every element of a contiguous CPU fp32 tensor to the nearest bf16
/// value (ties to even, as LibTorch's conversion; NaN stays NaN), in place:
/// fp32 tensors that carry bf16 values (Bf16Products::kWidened).
void round_to_bf16_values(at::Tensor& t);

/// Copies the upper triangle of every (contiguous, square) matrix of a
/// (b, s, s) tensor onto its lower triangle.
void mirror_upper_to_lower(at::Tensor& out);

}  // namespace muon::detail
