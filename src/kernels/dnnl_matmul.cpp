// Matrix products through oneDNN's matmul primitive (the library LibTorch's
// own CPU bf16 matmul runs on), for what ATen's matmul cannot express:
// bf16 inputs with an fp32 result (exact products, fp32 accumulation, no
// rounding to bf16 in between), results written into strided blocks of a
// larger matrix (the panels of a symmetric product), and β·C + α·A·B in one
// pass. Compiled only when oneDNN's headers and library are found.
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/empty_product.h"
#include "kernels/symmetric.h"

namespace muon::detail {
namespace {

using dnnl::memory;

// A matrix (2-D) or a batch of matrices (3-D) oneDNN can read as it is:
// each matrix with one unit stride (row- or column-major, any leading
// dimension), the other stride not overlapping it, and batches apart.
bool plain(const at::Tensor& t) {
  if (t.dim() != 2 && t.dim() != 3) return false;
  const int64_t d = t.dim();
  const auto r = t.stride(d - 2);
  const auto c = t.stride(d - 1);
  const int64_t rows = t.size(d - 2);
  const int64_t cols = t.size(d - 1);
  const bool matrix = (c == 1 && r >= std::max<int64_t>(cols, 1)) ||
                      (r == 1 && c >= std::max<int64_t>(rows, 1));
  if (!matrix || d == 2 || t.size(0) <= 1) return matrix;
  const int64_t extent = (rows - 1) * r + (cols - 1) * c + 1;
  return t.stride(0) >= extent;
}

constexpr int64_t kFp32Chunk = 128;

bool supported_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; }

memory::data_type dnnl_dtype(at::ScalarType t) {
  return t == at::kFloat ? memory::data_type::f32 : memory::data_type::bf16;
}

memory::desc describe(const at::Tensor& t) {
  const memory::dims dims(t.sizes().begin(), t.sizes().end());
  const memory::dims strides(t.strides().begin(), t.strides().end());
  return memory::desc(dims, dnnl_dtype(t.scalar_type()), strides);
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN (OpenMP build) runs a primitive on omp_get_max_threads() threads
// of the calling thread; this sets that count for one call.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : old_(exchange_omp_threads(n)) {}
  ~ScopedOmpThreads() { exchange_omp_threads(old_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int old_;
};

}  // namespace

bool dnnl_matmul_available() { return true; }

int exchange_omp_threads(int n) {
  const int old = omp_get_max_threads();
  if (n != old) omp_set_num_threads(n);
  return old;
}

bool dnnl_has_avx512() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & avx512) == avx512;
}

std::string dnnl_isa_name() {
  // The effective ISA: the CPU's, or less where ONEDNN_MAX_CPU_ISA says so.
  // Names as ONEDNN_MAX_CPU_ISA spells them; the highest that matches.
  using isa = dnnl::cpu_isa;
  const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const std::pair<isa, const char*> levels[] = {
      {isa::avx512_core_amx, "AVX512_CORE_AMX"}, {isa::avx512_core_bf16, "AVX512_CORE_BF16"},
      {isa::avx512_core_vnni, "AVX512_CORE_VNNI"}, {isa::avx512_core, "AVX512_CORE"},
      {isa::avx2_vnni, "AVX2_VNNI"},             {isa::avx2, "AVX2"},
      {isa::avx, "AVX"},                         {isa::sse41, "SSE41"}};
  for (const auto& [level, name] : levels) {
    const auto bits = static_cast<unsigned>(level);
    if ((effective & bits) == bits) return name;
  }
  return "NONE";
}

bool dnnl_bf16_available() {
  // oneDNN decides per primitive whether the CPU (under ONEDNN_MAX_CPU_ISA)
  // has a bf16 matmul: oneDNN 2.x needs AVX512_CORE, and has none on AVX2.
  // Below AVX512_CORE_BF16 it emulates bf16 dot products in AVX-512 at
  // under half its own fp32 rate (81 against 171 GFLOP/s here at
  // AVX512_CORE), so there the widened fp32 products are both faster and
  // the same arithmetic: only native bf16 (AVX512_CORE_BF16, AMX; AVX2_VNNI_2
  // in oneDNN 3) counts. Asked once, with both result dtypes the products use.
  static const bool available = [] {
    using isa = dnnl::cpu_isa;
    const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    auto has = [&](isa level) {
      const auto bits = static_cast<unsigned>(level);
      return (effective & bits) == bits;
    };
    bool native = has(isa::avx512_core_bf16);
#if DNNL_VERSION_MAJOR >= 3
    native = native || has(isa::avx2_vnni_2);
#endif
    if (!native) return false;
    const auto& engine = cpu_engine();
    try {
      for (const auto dst : {memory::data_type::f32, memory::data_type::bf16}) {
        const memory::desc a({8, 8}, memory::data_type::bf16, memory::format_tag::ab);
        const memory::desc c({8, 8}, dst, memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
        const dnnl::matmul::primitive_desc pd(engine, a, a, c);
#else
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), engine);
#endif
        (void)pd;
      }
    } catch (const dnnl::error&) {
      return false;
    }
    return true;
  }();
  return available;
}

bool dnnl_matmul(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                 double beta, int threads, bool chunk_fp32_k) {
  if (!out.device().is_cpu() || !a.device().is_cpu() || !b.device().is_cpu()) return false;
  const auto in = a.scalar_type();
  if (!supported_dtype(in) || b.scalar_type() != in || !supported_dtype(out.scalar_type())) {
    return false;
  }
  if (in == at::kBFloat16 && !dnnl_bf16_available()) return false;  // none, or emulated
  // bf16 results only from bf16 inputs; fp32 inputs only give fp32
  // results. β·C reads out's own values (bf16 or fp32), scales and adds
  // them in fp32 before the one rounding of the result.
  if (out.scalar_type() == at::kBFloat16 && in != at::kBFloat16) return false;
  const int64_t d = out.dim();
  if (a.dim() != d || b.dim() != d || !plain(a) || !plain(b) || !plain(out) ||
      out.stride(d - 1) != 1) {
    return false;
  }
  if (a.size(d - 2) != out.size(d - 2) || b.size(d - 1) != out.size(d - 1) ||
      a.size(d - 1) != b.size(d - 2) ||
      (d == 3 && (a.size(0) != out.size(0) || b.size(0) != out.size(0)))) {
    return false;
  }
  const int64_t k = a.size(d - 1);
  if (out.numel() == 0) return true;
  if (k == 0) {
    detail::scale_empty_product(out, beta);
    return true;
  }
  if (at::in_parallel_region()) return false;  // keep oneDNN's threads out of ATen's
  if (in == at::kFloat && chunk_fp32_k && k > kFp32Chunk) {
    // fp32: sum over K in chunks, each added into the result (OpenBLAS
    // blocks K too). oneDNN's kernel otherwise keeps one accumulation chain
    // over all of K, and Newton–Schulz then lands at 1.3–1.45× the plain
    // formula's error against fp64. 1024×4096, quintic ×5: unchunked
    // 1.39e-6, chunks of 256 1.03e-6, of 128 0.79e-6, plain 1.05e-6; the
    // chunks of 128 cost 0–10% more time.
    for (int64_t k0 = 0; k0 < k; k0 += kFp32Chunk) {
      const int64_t kk = std::min(kFp32Chunk, k - k0);
      const bool ok = dnnl_matmul(out, a.narrow(d - 1, k0, kk), b.narrow(d - 2, k0, kk), alpha,
                                  k0 == 0 ? beta : 1.0, threads, false);
      TORCH_INTERNAL_ASSERT(ok || k0 == 0, "oneDNN took one K chunk but not the next");
      if (!ok) return false;
    }
    return true;
  }
  const auto a_md = describe(a);
  const auto b_md = describe(b);
  const auto c_md = describe(out);
  // α as an output scale (a post-op would send oneDNN 2.x to its reference
  // kernel), β·C as a sum post-op.
  dnnl::post_ops ops;
  if (beta != 0.0) ops.append_sum(static_cast<float>(beta));
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const float scale = static_cast<float>(alpha);
  if (alpha != 1.0) {
#if DNNL_VERSION_MAJOR >= 3
    attr.set_scales_mask(DNNL_ARG_SRC, 0);
#else
    attr.set_output_scales(0, {scale});
#endif
  }
  const auto& engine = cpu_engine();
  // Primitives split their work at creation for the threads of that moment.
  ScopedOmpThreads scope(std::max(threads, 1));
  dnnl::matmul prim;
  try {
    // oneDNN's primitive cache makes a repeated description cheap (~3 µs).
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(engine, a_md, b_md, c_md, attr);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
#endif
    prim = dnnl::matmul(pd);
  } catch (const dnnl::error&) {
    return false;  // no implementation for this case: the caller falls back to ATen
  }
  memory a_mem(a_md, engine, const_cast<void*>(a.data_ptr()));
  memory b_mem(b_md, engine, const_cast<void*>(b.data_ptr()));
  memory c_mem(c_md, engine, out.data_ptr());
  dnnl::stream stream(engine);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
#if DNNL_VERSION_MAJOR >= 3
  if (alpha != 1.0) {
    args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC,
                 memory({{1}, memory::data_type::f32, {1}}, engine, const_cast<float*>(&scale)));
  }
#endif
  prim.execute(stream, args);
  stream.wait();
  return true;
}

}  // namespace muon::detail
