// The library's CUDA kernels (see kernels.h). Compiled with -fmad=false:
// each element-wise expression rounds as the CPU passes
// (src/kernels/fused_update.cpp, built with -ffp-contract=off) round it.
#include "kernels/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace muon::detail::cuda {
namespace {

constexpr int kTile = 32;          // symmetrize: 32×32 tiles, 32×8 threads
constexpr int kTileRows = 8;
constexpr int kThreads = 256;      // element-wise passes
constexpr int64_t kChunk = 65536;  // elements per block of an element-wise pass
constexpr int64_t kMaxGridY = 65535;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);  // round to nearest even, NaN stays NaN
}

// Block (bx, by) of matrix z writes tile (by, bx) of out from tile
// (min, max) of `in`, held in shared memory: an element below the diagonal
// reads its mirror image above it.
template <typename In, typename Out>
__global__ void symmetrize_kernel(Out* out, In* in, int64_t s, float shift, bool complete_in,
                                  bool in_place) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t z = blockIdx.z;
  const int64_t bi = blockIdx.y;
  const int64_t bj = blockIdx.x;
  const int64_t si = min(bi, bj) * kTile;
  const int64_t sj = max(bi, bj) * kTile;
  In* src = in + z * s * s;
  Out* dst = out + z * s * s;
  const int c = static_cast<int>(threadIdx.x);
  for (int r = static_cast<int>(threadIdx.y); r < kTile; r += kTileRows) {
    const int64_t gi = si + r;
    const int64_t gj = sj + c;
    tile[r][c] = (gi < s && gj < s) ? to_float(src[gi * s + gj]) : 0.0f;
  }
  __syncthreads();  // the diagonal block writes the tile it read
  for (int r = static_cast<int>(threadIdx.y); r < kTile; r += kTileRows) {
    const int64_t i = bi * kTile + r;
    const int64_t j = bj * kTile + c;
    if (i >= s || j >= s) continue;
    float v = i > j ? tile[c][r] : tile[r][c];
    if (i == j) v += shift;
    if (!in_place || i >= j) dst[i * s + j] = from_float<Out>(v);
    if (complete_in && !in_place && i >= j) src[i * s + j] = from_float<In>(v);
  }
}

template <typename In, typename Out>
int launch_symmetrize(Out* out, In* in, int64_t batch, int64_t s, float shift, bool complete_in,
                      bool in_place, cudaStream_t stream) {
  if (batch == 0 || s == 0) return cudaSuccess;
  const auto tiles = static_cast<unsigned>((s + kTile - 1) / kTile);
  for (int64_t z0 = 0; z0 < batch; z0 += kMaxGridY) {
    const auto zs = static_cast<unsigned>(std::min(kMaxGridY, batch - z0));
    symmetrize_kernel<In, Out><<<dim3(tiles, tiles, zs), dim3(kTile, kTileRows), 0, stream>>>(
        out + z0 * s * s, in + z0 * s * s, s, shift, complete_in, in_place);
  }
  return static_cast<int>(cudaGetLastError());
}

// The buffer's new value and the update u of one element, as the CPU's
// momentum_of and update_of compute them.
__device__ __forceinline__ float new_buffer(const MatrixSlot& m, float g, float b) {
  return m.ema ? b + (1.0f - m.mu) * (g - b) : m.mu * b + g;
}

__device__ __forceinline__ float update_of(const MatrixSlot& m, float g, float nb) {
  if (!m.nesterov) return nb;
  return m.ema ? nb - (nb - g) * (1.0f - m.mu) : g + m.mu * nb;
}

// Sums v over the block (fp64) into thread 0's return value.
__device__ double block_sum(double v) {
  __shared__ double part[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += part[w];
  }
  return total;
}

__global__ void momentum_kernel(const MatrixSlot* slots, int64_t matrices, int64_t numel,
                                int64_t chunks, double* partials) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(numel, begin + kChunk);
  for (int64_t mi = blockIdx.y; mi < matrices; mi += gridDim.y) {
    const MatrixSlot m = slots[mi];
    double acc = 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
      const float g = m.grad[i];
      const float nb = new_buffer(m, g, m.buf[i]);
      m.buf[i] = nb;
      const double u = update_of(m, g, nb);
      acc += u * u;  // exact in fp64: no overflow where fp32's u² would
    }
    const double total = block_sum(acc);
    if (threadIdx.x == 0) partials[mi * chunks + blockIdx.x] = total;
    __syncthreads();  // block_sum's shared memory is reused for the next matrix
  }
}

template <typename Out>
__global__ void normalize_kernel(const MatrixSlot* slots, int64_t matrices, int64_t numel,
                                 int64_t chunks, const double* partials, double safety,
                                 double eps, bool clamp, Out* x0) {
  __shared__ float scale;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(numel, begin + kChunk);
  for (int64_t mi = blockIdx.y; mi < matrices; mi += gridDim.y) {
    if (threadIdx.x == 0) {
      double sum = 0;  // the same order in every block of the matrix
      for (int64_t c = 0; c < chunks; ++c) sum += partials[mi * chunks + c];
      const double norm = sqrt(sum) * safety;
      scale = static_cast<float>(clamp ? 1.0 / max(norm, eps) : 1.0 / (norm + eps));
    }
    __syncthreads();
    const MatrixSlot m = slots[mi];
    Out* out = x0 + mi * numel;
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
      out[i] = from_float<Out>(update_of(m, m.grad[i], m.buf[i]) * scale);
    }
    __syncthreads();  // scale is rewritten for the next matrix
  }
}

template <typename Orth>
__global__ void decay_and_add_kernel(const MatrixSlot* slots, int64_t matrices, int64_t numel) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(numel, begin + kChunk);
  for (int64_t mi = blockIdx.y; mi < matrices; mi += gridDim.y) {
    const MatrixSlot m = slots[mi];
    const Orth* o = static_cast<const Orth*>(m.orth);
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
      m.param[i] = m.param[i] * m.decay + m.step * to_float(o[i]);
    }
  }
}

dim3 pass_grid(int64_t matrices, int64_t numel) {
  return dim3(static_cast<unsigned>(chunks_per_matrix(numel)),
              static_cast<unsigned>(std::min(matrices, kMaxGridY)));
}

}  // namespace

int symmetrize(void* out, Dtype out_dtype, float* upper, int64_t batch, int64_t s, float shift,
               bool complete_upper, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  const bool in_place = out == static_cast<void*>(upper);
  if (out_dtype == Dtype::kBFloat16) {
    return launch_symmetrize(static_cast<__nv_bfloat16*>(out), upper, batch, s, shift,
                             complete_upper, false, st);
  }
  return launch_symmetrize(static_cast<float*>(out), upper, batch, s, shift, complete_upper,
                           in_place, st);
}

int mirror_bf16(void* data, int64_t batch, int64_t s, void* stream) {
  auto* d = static_cast<__nv_bfloat16*>(data);
  return launch_symmetrize(d, d, batch, s, 0.0f, false, true, static_cast<cudaStream_t>(stream));
}

int64_t chunks_per_matrix(int64_t numel) { return std::max<int64_t>(1, (numel + kChunk - 1) / kChunk); }

int momentum(const MatrixSlot* slots, int64_t matrices, int64_t numel, double* partials,
             void* stream) {
  if (matrices == 0) return cudaSuccess;
  momentum_kernel<<<pass_grid(matrices, numel), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      slots, matrices, numel, chunks_per_matrix(numel), partials);
  return static_cast<int>(cudaGetLastError());
}

int normalize(const MatrixSlot* slots, int64_t matrices, int64_t numel, const double* partials,
              double safety, double eps, bool clamp, void* x0, Dtype x0_dtype, void* stream) {
  if (matrices == 0) return cudaSuccess;
  const auto grid = pass_grid(matrices, numel);
  const auto st = static_cast<cudaStream_t>(stream);
  const int64_t chunks = chunks_per_matrix(numel);
  if (x0_dtype == Dtype::kBFloat16) {
    normalize_kernel<<<grid, kThreads, 0, st>>>(slots, matrices, numel, chunks, partials, safety,
                                                eps, clamp, static_cast<__nv_bfloat16*>(x0));
  } else {
    normalize_kernel<<<grid, kThreads, 0, st>>>(slots, matrices, numel, chunks, partials, safety,
                                                eps, clamp, static_cast<float*>(x0));
  }
  return static_cast<int>(cudaGetLastError());
}

int decay_and_add(const MatrixSlot* slots, int64_t matrices, int64_t numel, Dtype orth_dtype,
                  void* stream) {
  if (matrices == 0) return cudaSuccess;
  const auto grid = pass_grid(matrices, numel);
  const auto st = static_cast<cudaStream_t>(stream);
  if (orth_dtype == Dtype::kBFloat16) {
    decay_and_add_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(slots, matrices, numel);
  } else {
    decay_and_add_kernel<float><<<grid, kThreads, 0, st>>>(slots, matrices, numel);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace muon::detail::cuda
