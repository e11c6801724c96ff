// Generic symmetric products (any device, any dtype) and dispatch.
#include "kernels/symmetric.h"

#include <ATen/Parallel.h>

#include "kernels/cuda.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace muon::detail {
namespace {

// Rows of op(X) in [begin, begin + n): (b, n, l).
at::Tensor op_rows(const at::Tensor& x, bool trans, int64_t begin, int64_t n) {
  return trans ? x.narrow(2, begin, n).transpose(1, 2) : x.narrow(1, begin, n);
}

// Row panels of the blocked symmetric product: panel i holds rows
// [i·h, (i+1)·h) and columns [i·h, s), so k panels cost (k+1)/(2k) of one
// GEMM. oneDNN on CPU keeps its speed down to 128-row panels, so four
// panels save most of the (k+1)/(2k) bound (docs/benchmarks.md); other
// backends get at most two panels of at least 384 rows.
int64_t num_panels(int64_t s, bool cpu_dnnl, bool cpu_16bit) {
  if (cpu_dnnl) return std::clamp<int64_t>(s / 128, 1, 4);
  if (cpu_16bit) return 1;  // ATen's bf16 GEMM: one full product beats two panels
  return std::clamp<int64_t>(s / 384, 1, 2);
}

// Threads for a CPU product of inputs of this dtype. bf16 products run on
// LibTorch's intra-op threads, as LibTorch's own bf16 matmul (oneDNN) does.
// fp32 products take the system BLAS's thread count when it is larger:
// that is what LibTorch's own fp32 matmul runs on (OpenBLAS keeps its own
// pool, whatever at::get_num_threads() says).
thread_local bool sixteen_bit_compute = false;
thread_local bool one_thread = false;  // OneThreadScope

int product_threads(at::ScalarType dtype) {
  if (one_thread) return 1;
  const int torch_threads = at::get_num_threads();
  if (sixteen_bit_compute || dtype != at::kFloat) return torch_threads;
  return std::max(torch_threads, blas_num_threads());
}

// Whether CPU products of this input dtype go to oneDNN.
bool on_dnnl(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return dnnl_bf16_available();
  return dtype == at::kFloat && fp32_products_on_dnnl();
}

// CPU bf16 operands where oneDNN has no bf16 matmul (AVX2): widened to fp32,
// which is exact (8-bit significands), so that each product of two is exact
// in fp32 too and the fp32 product sums them in fp32, as a bf16 matmul with
// fp32 accumulation does. LibTorch's own bf16 GEMM is never used: on such
// CPUs it sums some layouts in bf16 (LibTorch 1.13: ~15× the error).
bool widens(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kBFloat16 &&
         bf16_products() == Bf16Products::kWidened;
}

// Runs `product(acc)`, which writes beta·acc + alpha·(...) in fp32, for
// `out`: into out itself when it is fp32; else into an fp32 copy of out (or
// fresh memory when beta is 0), rounded once into out afterwards.
template <typename Product>
bool into_fp32(at::Tensor& out, double beta, const Product& product) {
  if (out.scalar_type() == at::kFloat) return product(out);
  auto acc = beta != 0.0 ? out.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                         : at::empty(out.sizes(), out.options().dtype(at::kFloat));
  const bool result = product(acc);
  out.copy_(acc);
  return result;
}

void product_2d(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                double beta);

// out = beta·out + alpha·a·b from widened operands, summed in fp32 and, for
// a bf16 out, rounded once.
void widened_product(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                     double beta) {
  const auto a32 = a.to(at::kFloat);
  const auto b32 = b.to(at::kFloat);
  into_fp32(out, beta, [&](at::Tensor& acc) {
    product_2d(acc, a32, b32, alpha, beta);
    return true;
  });
}

// out = beta·out + alpha·a·b for one matrix; out may be a strided block.
void product_2d(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                double beta) {
  if (widens(a)) {
    widened_product(out, a, b, alpha, beta);
    return;
  }
  if (out.device().is_cpu() && on_dnnl(a.scalar_type()) &&
      dnnl_matmul(out, a, b, alpha, beta, product_threads(a.scalar_type()), !sixteen_bit_compute)) {
    return;
  }
  const auto a1 = a.to(out.scalar_type());  // no copy when the dtype already matches
  const auto b1 = b.to(out.scalar_type());
  if (beta == 0.0) {
    at::mm_out(out, a1, b1);
    if (alpha != 1.0) out.mul_(alpha);
  } else {
    out.addmm_(a1, b1, beta, alpha);
  }
}

// out = beta·out + alpha·a·b for batches of matrices; out may be a view.
void batched_product(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                     double beta) {
  if (out.is_cuda() && cuda_matmul(out, a, b, alpha, beta)) return;  // cuBLAS, fp32 sums
  if (out.device().is_cpu() && out.size(0) > 1 && on_dnnl(a.scalar_type()) &&
      dnnl_matmul(out, a, b, alpha, beta, product_threads(a.scalar_type()), !sixteen_bit_compute)) {
    return;  // one oneDNN primitive for the whole batch: no per-matrix call costs
  }
  if (out.device().is_cpu() || out.size(0) == 1) {
    // On CPU a loop of GEMMs beats LibTorch 1.13's bmm (docs/benchmarks.md);
    // each GEMM is threaded.
    for (int64_t i = 0; i < out.size(0); ++i) {
      auto o = out.select(0, i);
      product_2d(o, a.select(0, i), b.select(0, i), alpha, beta);
    }
    return;
  }
  const auto a1 = a.to(out.scalar_type());  // no copy when the dtype already matches
  const auto b1 = b.to(out.scalar_type());
  if (beta != 0.0) {
    out.baddbmm_(a1, b1, beta, alpha);
  } else if (out.is_contiguous()) {
    at::bmm_out(out, a1, b1);
    if (alpha != 1.0) out.mul_(alpha);
  } else {
    out.copy_(alpha == 1.0 ? at::bmm(a1, b1) : at::bmm(a1, b1).mul_(alpha));
  }
}

// Copies the upper triangle's element (j, i) onto (i, j) for i, j in the
// given ranges with j < i.
template <typename scalar_t>
inline void mirror_block(scalar_t* m, int64_t s, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t jend = std::min(j1, i);
    for (int64_t j = j0; j < jend; ++j) m[i * s + j] = m[j * s + i];
  }
}

#if defined(__SSE2__)
// One 4×4 block below the diagonal from its mirror image, in registers.
inline bool mirror_4x4(float* m, int64_t s, int64_t i, int64_t j) {
  const float* src = m + j * s + i;
  __m128 r0 = _mm_loadu_ps(src);
  __m128 r1 = _mm_loadu_ps(src + s);
  __m128 r2 = _mm_loadu_ps(src + 2 * s);
  __m128 r3 = _mm_loadu_ps(src + 3 * s);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  float* dst = m + i * s + j;
  _mm_storeu_ps(dst, r0);
  _mm_storeu_ps(dst + s, r1);
  _mm_storeu_ps(dst + 2 * s, r2);
  _mm_storeu_ps(dst + 3 * s, r3);
  return true;
}
#endif

template <typename scalar_t>
inline bool mirror_4x4(scalar_t*, int64_t, int64_t, int64_t) {
  return false;
}

template <typename scalar_t>
void mirror_impl(scalar_t* data, int64_t batch, int64_t s) {
  constexpr int64_t kTile = 64;
  const int64_t tiles = (s + kTile - 1) / kTile;
  at::parallel_for(0, batch * tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      scalar_t* m = data + (t / tiles) * s * s;
      const int64_t i0 = (t % tiles) * kTile;
      const int64_t i1 = std::min(s, i0 + kTile);
      // Row block [i0, i1) of the lower triangle reads column block [i0, i1)
      // of the upper triangle, tile by tile; whole 4×4 blocks below the
      // diagonal are transposed in registers (fp32), the rest element-wise.
      for (int64_t j0 = 0; j0 < i1; j0 += kTile) {
        const int64_t j1 = std::min(j0 + kTile, i1);
        for (int64_t i = i0; i < i1; i += 4) {
          const int64_t ie = std::min(i + 4, i1);
          for (int64_t j = j0; j < std::min(j1, ie); j += 4) {
            const int64_t je = std::min(j + 4, j1);
            if (!(ie - i == 4 && je - j == 4 && je <= i && mirror_4x4(m, s, i, j))) {
              mirror_block(m, s, i, ie, j, je);
            }
          }
        }
      }
    }
  });
}

}  // namespace

void round_to_bf16_values(at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous());
  auto* bits = static_cast<uint32_t*>(t.data_ptr());
  at::parallel_for(0, t.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t u = bits[i];
      const bool nan = (u & 0x7fffffffU) > 0x7f800000U;
      // Round to nearest, ties to even, on the upper 16 bits (a carry into
      // the exponent gives the next binade, or infinity, as it should).
      const uint32_t rounded = (u + 0x7fffU + ((u >> 16) & 1U)) & 0xffff0000U;
      bits[i] = nan ? (u | 0x00400000U) & 0xffff0000U : rounded;
    }
  });
}

void mirror_upper_to_lower(at::Tensor& out) {
  TORCH_INTERNAL_ASSERT(out.dim() == 3 && out.size(1) == out.size(2) && out.is_contiguous());
  if (cuda_mirror(out)) return;
  if (!out.device().is_cpu()) {
    // Other devices: triu + transposed strict triu, as tensor ops.
    auto upper = out.triu();
    out.copy_(upper + upper.triu(1).transpose(1, 2));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "mirror", [&] {
    mirror_impl<scalar_t>(out.data_ptr<scalar_t>(), out.size(0), out.size(1));
  });
}

bool fp32_products_on_dnnl() {
  static const bool on = [] {
    const char* env = std::getenv("MUON_FP32_PRODUCTS");
    const std::string choice = env ? env : "";
    if (choice == "blas") return false;
    if (choice == "onednn") return dnnl_matmul_available();
    TORCH_CHECK_VALUE(choice.empty() || choice == "auto",
                      "[muon] MUON_FP32_PRODUCTS must be auto, blas or onednn, got '", choice, "'");
    std::string core = blas_core_name();
    std::transform(core.begin(), core.end(), core.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    const bool blas_avx512 = core.find("skylakex") != std::string::npos ||
                             core.find("cooperlake") != std::string::npos ||
                             core.find("sapphirerapids") != std::string::npos;
    return dnnl_matmul_available() && dnnl_has_avx512() && !blas_avx512;
  }();
  return on;
}

bool accumulates_in_fp32(const at::Tensor& x) {
  if (x.scalar_type() != at::kBFloat16) return false;
  return x.device().is_cpu() || (x.is_cuda() && cuda_kernels_built());  // cuBLAS: bf16 in, fp32 out
}

Bf16Products bf16_products() {
  return dnnl_bf16_available() ? Bf16Products::kOneDnn : Bf16Products::kWidened;
}

std::string describe_cpu_products(at::ScalarType dtype) {
  const std::string isa = dnnl_matmul_available() ? "oneDNN ISA " + dnnl_isa_name() : "no oneDNN";
  std::string core = blas_core_name();
  const std::string blas = core.empty() ? "ATen's BLAS" : "OpenBLAS (" + core + " kernels)";
  const std::string fp32 = fp32_products_on_dnnl()
                               ? "oneDNN fp32 matmul (row panels for symmetric products)"
                               : blas + (core.empty() ? "" : ", SYRK for symmetric products");
  if (dtype != at::kBFloat16) return "fp32 products: " + fp32 + "; " + isa;
  if (bf16_products() == Bf16Products::kOneDnn) {
    return "bf16 products: oneDNN bf16 matmul, fp32 sums rounded once; " + isa;
  }
  return "bf16 products: operands widened to fp32 (exact), " + fp32 +
         ", rounded once (oneDNN has no bf16 matmul here); " + isa;
}

SixteenBitCompute::SixteenBitCompute() : previous_(sixteen_bit_compute) {
  sixteen_bit_compute = true;
}

SixteenBitCompute::~SixteenBitCompute() { sixteen_bit_compute = previous_; }

OneThreadScope::OneThreadScope() : previous_(one_thread), previous_threads_(exchange_omp_threads(1)) {
  one_thread = true;
}

OneThreadScope::~OneThreadScope() {
  one_thread = previous_;
  exchange_omp_threads(previous_threads_);
}

bool products_follow_thread_scope(at::ScalarType dtype) {
  if (!dnnl_matmul_available()) return false;
  if (dtype == at::kBFloat16 && on_dnnl(at::kBFloat16)) return true;
  // fp32 products, and bf16 ones widened to fp32.
  return (dtype == at::kFloat || dtype == at::kBFloat16) && fp32_products_on_dnnl();
}

void batched_mm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  batched_product(out, a, b, 1.0, 0.0);
}

void batched_addmm_out(at::Tensor& out, const at::Tensor& c, const at::Tensor& a,
                       const at::Tensor& b, double beta, double alpha) {
  if (!out.device().is_cpu()) {
    if (out.is_cuda() && cuda_kernels_built()) {
      if (beta != 0.0 && !c.is_same(out)) out.copy_(c);
      if (cuda_matmul(out, a, b, alpha, beta)) return;
      at::baddbmm_out(out, out, a, b, beta, alpha);
      return;
    }
    at::baddbmm_out(out, c, a, b, beta, alpha);
    return;
  }
  if (beta != 0.0) out.copy_(c);
  batched_product(out, a, b, alpha, beta);
}

namespace {

// The upper triangle of beta·out + alpha·op(X)·op(X)ᵀ; returns false when
// the whole matrix is already symmetric (CBLAS mirrors itself). A full
// product (one panel) is not exactly symmetric in general (oneDNN's kernels
// order the sums differently for (i, j) and (j, i)), so it is mirrored too:
// Gram Newton–Schulz relies on R being symmetric to the bit.
bool upper_product(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta) {
  if (widens(x)) {
    // Widened once for all panels; fp32 kernels (SYRK or oneDNN panels).
    const auto x32 = x.to(at::kFloat);
    return into_fp32(out, beta,
                     [&](at::Tensor& acc) { return upper_product(acc, x32, trans, alpha, beta); });
  }
  if (out.is_cuda() && cuda_syrk_upper(out, x, trans, alpha, beta)) return true;  // upper tiles
  const int64_t s = out.size(1);
  const bool cpu = out.device().is_cpu();
  const bool cpu_dnnl = cpu && on_dnnl(x.scalar_type());
  if (!cpu_dnnl && out.scalar_type() == x.scalar_type() && cblas_syrk(out, x, trans, alpha, beta)) {
    return false;
  }
  // Row panels of the upper triangle, each a product into a block of out.
  const bool cpu_16bit =
      cpu && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
  const int64_t k = num_panels(s, cpu_dnnl, cpu_16bit);
  const int64_t step = (s + k - 1) / k;
  for (int64_t i0 = 0; i0 < s; i0 += step) {
    const int64_t h = std::min(step, s - i0);
    auto panel = out.narrow(1, i0, h).narrow(2, i0, s - i0);
    batched_product(panel, op_rows(x, trans, i0, h),
                    op_rows(x, trans, i0, s - i0).transpose(1, 2), alpha, beta);
  }
  return true;
}

}  // namespace

double symmetric_product_fraction(int64_t s, at::ScalarType dtype, bool gram) {
  if (dtype == at::kBFloat16 && bf16_products() == Bf16Products::kWidened) dtype = at::kFloat;
  const bool is16 = dtype == at::kBFloat16 || dtype == at::kHalf;
  const bool dnnl = on_dnnl(dtype);
  if (gram && !dnnl && !is16) return 0.5;  // CBLAS SYRK
  const auto k = static_cast<double>(num_panels(s, dnnl, is16));
  return (k + 1) / (2 * k);
}

void commuting_addmm_out(at::Tensor& out, const at::Tensor& c, const at::Tensor& a,
                         const at::Tensor& b, double beta, double alpha) {
  TORCH_INTERNAL_ASSERT(out.dim() == 3 && out.size(1) == out.size(2) && out.is_contiguous());
  if (beta != 0.0 && !c.is_same(out)) out.copy_(c);
  if (out.is_cuda() && cuda_commuting_upper(out, a, b, alpha, beta)) {
    mirror_upper_to_lower(out);
    return;
  }
  const int64_t s = out.size(1);
  const bool cpu = out.device().is_cpu();
  const bool cpu_16bit =
      cpu && (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf);
  const int64_t k = num_panels(s, cpu && on_dnnl(a.scalar_type()), cpu_16bit);
  const int64_t step = (s + k - 1) / k;
  for (int64_t i0 = 0; i0 < s; i0 += step) {
    const int64_t h = std::min(step, s - i0);
    auto panel = out.narrow(1, i0, h).narrow(2, i0, s - i0);
    batched_product(panel, a.narrow(1, i0, h), b.narrow(2, i0, s - i0), alpha, beta);
  }
  mirror_upper_to_lower(out);
}

void syrk(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta,
          bool symmetric_kernels) {
  if (!symmetric_kernels) {
    auto xt = op_rows(x, trans, 0, out.size(1));
    batched_product(out, xt, xt.transpose(1, 2), alpha, beta);
    return;
  }
  if (upper_product(out, x, trans, alpha, beta)) mirror_upper_to_lower(out);
}

bool syrk_upper(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta) {
  return !upper_product(out, x, trans, alpha, beta);
}

void symmetric_from_upper(at::Tensor& out, at::Tensor& upper, double shift) {
  // Mirror in fp32 (a tiled copy), then one vectorized conversion by ATen:
  // faster than converting element by element while mirroring.
  if (cuda_symmetrize(out, upper, shift)) return;  // one tiled pass on the GPU
  mirror_upper_to_lower(upper);
  if (shift != 0.0) upper.diagonal(0, 1, 2).add_(shift);
  out.copy_(upper);
}

}  // namespace muon::detail
