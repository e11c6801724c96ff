// Matrix products through oneDNN's matmul primitive (the library LibTorch's
// own CPU bf16 matmul runs on), for what ATen's matmul cannot express:
// bf16 inputs with an fp32 result (exact products, fp32 accumulation, no
// rounding to bf16 in between), results written into strided blocks of a
// larger matrix (the panels of a symmetric product), and β·C + α·A·B in one
// pass. Compiled only when oneDNN's headers and library are found.
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/symmetric.h"

namespace muon::detail {
namespace {

using dnnl::memory;

bool plain_2d(const at::Tensor& t) {
  // Each matrix needs one unit stride (row- or column-major, any leading
  // dimension); the other stride must not overlap it.
  if (t.dim() != 2) return false;
  const auto r = t.stride(0);
  const auto c = t.stride(1);
  return (c == 1 && r >= std::max<int64_t>(t.size(1), 1)) ||
         (r == 1 && c >= std::max<int64_t>(t.size(0), 1));
}

constexpr int64_t kFp32Chunk = 128;

bool supported_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; }

memory::data_type dnnl_dtype(at::ScalarType t) {
  return t == at::kFloat ? memory::data_type::f32 : memory::data_type::bf16;
}

memory::desc describe(const at::Tensor& t) {
  return memory::desc({t.size(0), t.size(1)}, dnnl_dtype(t.scalar_type()),
                      {t.stride(0), t.stride(1)});
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

bool dnnl_matmul(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                 double beta, int threads, bool chunk_fp32_k) {
  if (!out.device().is_cpu() || !a.device().is_cpu() || !b.device().is_cpu()) return false;
  const auto in = a.scalar_type();
  if (!supported_dtype(in) || b.scalar_type() != in || !supported_dtype(out.scalar_type())) {
    return false;
  }
  // bf16 results only without accumulation into them (β·C would be rounded
  // to bf16 before the sum); fp32 inputs only give fp32 results.
  if (out.scalar_type() == at::kBFloat16 && (in != at::kBFloat16 || beta != 0.0)) return false;
  if (!plain_2d(a) || !plain_2d(b) || !plain_2d(out) || out.stride(1) != 1) return false;
  if (a.size(0) != out.size(0) || b.size(1) != out.size(1) || a.size(1) != b.size(0)) {
    return false;
  }
  if (out.numel() == 0) return true;
  if (a.size(1) == 0) {
    if (beta == 0.0) {
      out.zero_();
    } else {
      out.mul_(beta);
    }
    return true;
  }
  if (at::in_parallel_region()) return false;  // keep oneDNN's threads out of ATen's
  if (in == at::kFloat && chunk_fp32_k && a.size(1) > kFp32Chunk) {
    // fp32: sum over K in chunks, each added into the result (OpenBLAS
    // blocks K too). oneDNN's kernel otherwise keeps one accumulation chain
    // over all of K, and Newton–Schulz then lands at 1.3–1.45× the plain
    // formula's error against fp64. 1024×4096, quintic ×5: unchunked
    // 1.39e-6, chunks of 256 1.03e-6, of 128 0.79e-6, plain 1.05e-6; the
    // chunks of 128 cost 0–10% more time.
    for (int64_t k0 = 0; k0 < a.size(1); k0 += kFp32Chunk) {
      const int64_t kk = std::min(kFp32Chunk, a.size(1) - k0);
      const bool ok = dnnl_matmul(out, a.narrow(1, k0, kk), b.narrow(0, k0, kk), alpha,
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
