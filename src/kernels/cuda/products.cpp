// cuBLAS products and symmetric products for CUDA tensors (kernels/cuda.h).
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/DeviceGuard.h>
#include <cublas_v2.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda.h"
#include "kernels/cuda/kernels.h"
#include "kernels/empty_product.h"

namespace muon::detail {
namespace {

bool cuda_data_type(at::ScalarType t, cudaDataType_t* out) {
  switch (t) {
    case at::kFloat: *out = CUDA_R_32F; return true;
    case at::kBFloat16: *out = CUDA_R_16BF; return true;
    case at::kHalf: *out = CUDA_R_16F; return true;
    case at::kDouble: *out = CUDA_R_64F; return true;
    default: return false;
  }
}

void check_cublas(cublasStatus_t status, const char* what) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "[muon] ", what, " failed: cuBLAS status ",
              static_cast<int>(status));
}

void check_launch(int error, const char* what) {
  TORCH_CHECK(error == 0, "[muon] ", what, " failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(error)));
}

// How cuBLAS (column-major) reads one row-major r×c operand with strides
// (sr, sc): the memory is Mᵀ with leading dimension sr when sc == 1 (op N
// gives Mᵀ), or M with leading dimension sc when sr == 1 (op T gives Mᵀ).
struct Operand {
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t ld = 0;
};

bool operand_of(int64_t rows, int64_t cols, int64_t sr, int64_t sc, Operand* out) {
  if (sc == 1 && (rows == 1 || sr >= std::max<int64_t>(1, cols))) {
    *out = {CUBLAS_OP_N, rows == 1 ? std::max<int64_t>(1, cols) : sr};
    return true;
  }
  if (sr == 1 && (cols == 1 || sc >= std::max<int64_t>(1, rows))) {
    *out = {CUBLAS_OP_T, cols == 1 ? std::max<int64_t>(1, rows) : sc};
    return true;
  }
  return false;
}

// The types of one product: inputs, output, compute type, and the scalars
// alpha and beta as that compute type reads them.
struct GemmTypes {
  cudaDataType_t in{}, out{};
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  float alpha32 = 1, beta32 = 0;
  double alpha64 = 1, beta64 = 0;
  const void* alpha() const { return compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&alpha64) : &alpha32; }
  const void* beta() const { return compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&beta64) : &beta32; }
};

bool gemm_types(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                double beta, GemmTypes* t) {
  if (a.scalar_type() != b.scalar_type()) return false;
  if (out.scalar_type() != a.scalar_type() && out.scalar_type() != at::kFloat) return false;
  if (!cuda_data_type(a.scalar_type(), &t->in) || !cuda_data_type(out.scalar_type(), &t->out)) {
    return false;
  }
  const bool f64 = a.scalar_type() == at::kDouble;
  if (f64 != (out.scalar_type() == at::kDouble)) return false;
  t->compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  t->alpha32 = static_cast<float>(alpha);
  t->beta32 = static_cast<float>(beta);
  t->alpha64 = alpha;
  t->beta64 = beta;
  return true;
}

bool on_one_cuda_device(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  return out.is_cuda() && a.device() == out.device() && b.device() == out.device();
}

// The handle on the current stream, with fp32 sums kept in fp32 (no
// reduced-precision split-K reductions, no TF32) until it goes.
class Handle {
 public:
  explicit Handle(const at::Device& device)
      : on_(device), handle_(at::cuda::getCurrentCUDABlasHandle()) {
    check_cublas(cublasGetMathMode(handle_, &previous_), "cublasGetMathMode");
    check_cublas(cublasSetMathMode(handle_, static_cast<cublasMath_t>(
                                                CUBLAS_DEFAULT_MATH |
                                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                 "cublasSetMathMode");
  }
  ~Handle() { cublasSetMathMode(handle_, previous_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  c10::DeviceGuard on_;  // the device's handle and current stream
  cublasHandle_t handle_;
  cublasMath_t previous_{};
};

// C = beta·C + alpha·A·B (row-major) for `count` tiles given by pointers,
// all m×n×k with the same strides: one cuBLAS call on device arrays.
struct TileProduct {
  int64_t m, n, k;
  Operand a, b;
  int64_t ldc;
};

void tile_gemms(const TileProduct& p, const std::vector<const void*>& a_ptrs,
                const std::vector<const void*>& b_ptrs, const std::vector<void*>& c_ptrs,
                const GemmTypes& t, const at::Tensor& like) {
  const auto count = static_cast<int64_t>(c_ptrs.size());
  auto host = at::empty({3 * count}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* h = reinterpret_cast<const void**>(host.data_ptr<int64_t>());
  std::copy(a_ptrs.begin(), a_ptrs.end(), h);
  std::copy(b_ptrs.begin(), b_ptrs.end(), h + count);
  std::copy(c_ptrs.begin(), c_ptrs.end(), h + 2 * count);
  const auto dev = host.to(like.device(), /*non_blocking=*/true);
  auto** d = reinterpret_cast<void**>(dev.data_ptr<int64_t>());
  Handle handle(like.device());
  // Column-major: Cᵀ = Bᵀ·Aᵀ.
  check_cublas(cublasGemmBatchedEx(handle.get(), p.b.op, p.a.op, static_cast<int>(p.n),
                                   static_cast<int>(p.m), static_cast<int>(p.k), t.alpha(),
                                   d + count, t.in, static_cast<int>(p.b.ld), d, t.in,
                                   static_cast<int>(p.a.ld), t.beta(), d + 2 * count, t.out,
                                   static_cast<int>(p.ldc), static_cast<int>(count), t.compute,
                                   CUBLAS_GEMM_DEFAULT),
               "cublasGemmBatchedEx");
}

// The upper tiles (i <= j) of a k×k tiling of the (b, s, s) out, with the
// row block i of the left operand and the column block j of the right one.
bool upper_tiles(at::Tensor& out, const at::Tensor& lhs, const at::Tensor& rhs, double alpha,
                 double beta) {
  const int64_t s = out.size(1);
  const int64_t tiles = cuda_tiles(s);
  GemmTypes t;
  if (tiles < 2 || !out.is_contiguous() || !on_one_cuda_device(out, lhs, rhs) ||
      !gemm_types(out, lhs, rhs, alpha, beta, &t)) {
    return false;
  }
  const int64_t h = s / tiles;
  const int64_t inner = lhs.size(2);
  TileProduct p{h, h, inner, {}, {}, s};
  if (!operand_of(h, inner, lhs.stride(1), lhs.stride(2), &p.a) ||
      !operand_of(inner, h, rhs.stride(1), rhs.stride(2), &p.b)) {
    return false;
  }
  std::vector<const void*> a_ptrs, b_ptrs;
  std::vector<void*> c_ptrs;
  const auto in_size = static_cast<int64_t>(lhs.element_size());
  const auto out_size = static_cast<int64_t>(out.element_size());
  auto* lbase = static_cast<const char*>(lhs.data_ptr());
  auto* rbase = static_cast<const char*>(rhs.data_ptr());
  auto* obase = static_cast<char*>(out.data_ptr());
  for (int64_t z = 0; z < out.size(0); ++z) {
    for (int64_t i = 0; i < tiles; ++i) {
      for (int64_t j = i; j < tiles; ++j) {
        a_ptrs.push_back(lbase + (z * lhs.stride(0) + i * h * lhs.stride(1)) * in_size);
        b_ptrs.push_back(rbase + (z * rhs.stride(0) + j * h * rhs.stride(2)) * in_size);
        c_ptrs.push_back(obase + (z * s * s + i * h * s + j * h) * out_size);
      }
    }
  }
  tile_gemms(p, a_ptrs, b_ptrs, c_ptrs, t, out);
  return true;
}

}  // namespace

bool cuda_kernels_built() { return true; }

void* cuda_current_stream(const at::Device& device) {
  // Read through ATen's cuBLAS handle (libtorch_cuda, which sets it to the
  // device's current stream), not c10's CUDA stream API: libmuon then needs
  // no libc10_cuda of its own, which a program linking an installed libmuon
  // could not find before LibTorch's own libraries load it.
  const c10::DeviceGuard on(device);
  cudaStream_t stream = nullptr;
  check_cublas(cublasGetStream(at::cuda::getCurrentCUDABlasHandle(), &stream), "cublasGetStream");
  return stream;
}

int64_t cuda_tiles(int64_t s) {
  // Tiles of 512 (256 where 512 does not divide s): each tile's product
  // still fills the GPU, and k tiles per side compute (k + 1)/(2k) of the
  // full product.
  if (s < 1024) return 1;
  if (s % 512 == 0) return s / 512;
  if (s % 256 == 0) return s / 256;
  return 1;
}

bool cuda_matmul(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                 double beta) {
  GemmTypes t;
  if (out.dim() != 3 || a.dim() != 3 || b.dim() != 3 || !on_one_cuda_device(out, a, b) ||
      !gemm_types(out, a, b, alpha, beta, &t)) {
    return false;
  }
  const int64_t m = out.size(1), n = out.size(2), k = a.size(2);
  if (out.numel() == 0) return true;
  Operand oa, ob, oc;
  if (!operand_of(m, k, a.stride(1), a.stride(2), &oa) ||
      !operand_of(k, n, b.stride(1), b.stride(2), &ob) ||
      !operand_of(m, n, out.stride(1), out.stride(2), &oc) || oc.op != CUBLAS_OP_N) {
    return false;
  }
  if (k == 0) {
    detail::scale_empty_product(out, beta);
    return true;
  }
  const int64_t batch = out.size(0);
  const auto stride_or_zero = [&](const at::Tensor& x) { return x.size(0) == 1 ? 0 : x.stride(0); };
  Handle handle(out.device());
  check_cublas(cublasGemmStridedBatchedEx(
                   handle.get(), ob.op, oa.op, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), t.alpha(), b.data_ptr(), t.in, static_cast<int>(ob.ld),
                   stride_or_zero(b), a.data_ptr(), t.in, static_cast<int>(oa.ld),
                   stride_or_zero(a), t.beta(), out.data_ptr(), t.out, static_cast<int>(oc.ld),
                   out.stride(0), static_cast<int>(batch), t.compute, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
  return true;
}

bool cuda_syrk_upper(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta) {
  if (x.dim() != 3 || out.dim() != 3) return false;
  const auto rows = trans ? x.transpose(1, 2) : x;  // op(X): (b, s, l)
  return upper_tiles(out, rows, rows.transpose(1, 2), alpha, beta);
}

bool cuda_commuting_upper(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                          double alpha, double beta) {
  if (a.dim() != 3 || b.dim() != 3 || out.dim() != 3) return false;
  return upper_tiles(out, a, b, alpha, beta);
}

bool cuda_symmetrize(at::Tensor& out, at::Tensor& upper, double shift) {
  if (!upper.is_cuda() || upper.scalar_type() != at::kFloat || !upper.is_contiguous() ||
      upper.dim() != 3 || out.device() != upper.device() || !out.is_contiguous() ||
      out.sizes() != upper.sizes() ||
      (out.scalar_type() != at::kFloat && out.scalar_type() != at::kBFloat16)) {
    return false;
  }
  const auto dtype =
      out.scalar_type() == at::kBFloat16 ? cuda::Dtype::kBFloat16 : cuda::Dtype::kFloat32;
  check_launch(cuda::symmetrize(out.data_ptr(), dtype, upper.data_ptr<float>(), upper.size(0),
                                upper.size(1), static_cast<float>(shift), /*complete_upper=*/true,
                                cuda_current_stream(upper.device())),
               "symmetrize");
  return true;
}

bool cuda_mirror(at::Tensor& t) {
  if (!t.is_cuda() || !t.is_contiguous() || t.dim() != 3) return false;
  void* stream = cuda_current_stream(t.device());
  if (t.scalar_type() == at::kFloat) {
    check_launch(cuda::symmetrize(t.data_ptr(), cuda::Dtype::kFloat32, t.data_ptr<float>(),
                                  t.size(0), t.size(1), 0.0f, true, stream),
                 "mirror");
    return true;
  }
  if (t.scalar_type() == at::kBFloat16) {
    check_launch(cuda::mirror_bf16(t.data_ptr(), t.size(0), t.size(1), stream), "mirror");
    return true;
  }
  return false;
}

}  // namespace muon::detail
