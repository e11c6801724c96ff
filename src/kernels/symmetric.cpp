// Generic symmetric products (any device, any dtype) and dispatch.
#include "kernels/symmetric.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace muon::detail {
namespace {

// Rows of op(X) in [begin, begin + n): (b, n, l).
at::Tensor op_rows(const at::Tensor& x, bool trans, int64_t begin, int64_t n) {
  return trans ? x.narrow(2, begin, n).transpose(1, 2) : x.narrow(1, begin, n);
}

// Number of row blocks for the blocked symmetric product: k blocks cost
// k(k+1)/2 GEMMs of (s/k)² outputs, i.e. (k+1)/(2k) of one GEMM. Blocks stay
// >= kMinBlock rows so each GEMM keeps the backend near its peak.
constexpr int64_t kMinBlock = 384;
constexpr int64_t kMaxBlocks = 2;

int64_t num_blocks(int64_t s) { return std::clamp<int64_t>(s / kMinBlock, 1, kMaxBlocks); }

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
      // of the upper triangle, tile by tile.
      for (int64_t j0 = 0; j0 < i1; j0 += kTile) {
        const int64_t j1 = std::min(j0 + kTile, i1);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t jend = std::min(j1, i);
          for (int64_t j = j0; j < jend; ++j) m[i * s + j] = m[j * s + i];
        }
      }
    }
  });
}

}  // namespace

void mirror_upper_to_lower(at::Tensor& out) {
  TORCH_INTERNAL_ASSERT(out.dim() == 3 && out.size(1) == out.size(2) && out.is_contiguous());
  if (!out.device().is_cpu()) {
    // Device tensors: triu + transposed strict triu, as tensor ops.
    auto upper = out.triu();
    out.copy_(upper + upper.triu(1).transpose(1, 2));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "mirror", [&] {
    mirror_impl<scalar_t>(out.data_ptr<scalar_t>(), out.size(0), out.size(1));
  });
}

void batched_mm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (out.size(0) == 1 || out.device().is_cpu()) {
    // On CPU a loop of GEMMs beats bmm (LibTorch 1.13 fp32 bmm: ~170 against
    // ~225 GFLOP/s for 512×512·512×2048 on 2 cores); each GEMM is threaded.
    for (int64_t i = 0; i < out.size(0); ++i) {
      auto o = out.select(0, i);
      at::mm_out(o, a.select(0, i), b.select(0, i));
    }
  } else {
    at::bmm_out(out, a, b);
  }
}

void batched_addmm_out(at::Tensor& out, const at::Tensor& c, const at::Tensor& a,
                       const at::Tensor& b, double beta, double alpha) {
  if (!out.device().is_cpu()) {
    at::baddbmm_out(out, c, a, b, beta, alpha);
    return;
  }
  for (int64_t i = 0; i < out.size(0); ++i) {
    auto o = out.select(0, i);
    at::addmm_out(o, c.select(0, i), a.select(0, i), b.select(0, i), beta, alpha);
  }
}

at::Tensor batched_addmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                         double beta, double alpha) {
  auto out = at::empty_like(c, at::MemoryFormat::Contiguous);
  batched_addmm_out(out, c, a, b, beta, alpha);
  return out;
}

void syrk(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta,
          bool symmetric_kernels) {
  const int64_t s = out.size(1);
  if (out.device().is_cpu() && out.size(0) > 1) {
    // One matrix at a time on CPU (each GEMM/SYRK is threaded; CPU bmm is slower).
    for (int64_t i = 0; i < out.size(0); ++i) {
      auto o = out.narrow(0, i, 1);
      syrk(o, x.narrow(0, i, 1), trans, alpha, beta, symmetric_kernels);
    }
    return;
  }
  // 16-bit on CPU: oneDNN's single GEMM beats the blocked product at every
  // size measured (2048²: 39.8 against 44.9 ms for the 2×2 blocks).
  const bool cpu_16bit = out.device().is_cpu() && (out.scalar_type() == at::kBFloat16 ||
                                                   out.scalar_type() == at::kHalf);
  if (!symmetric_kernels || cpu_16bit) {
    auto xt = op_rows(x, trans, 0, s);
    if (beta == 0.0) {
      batched_mm_out(out, xt, xt.transpose(1, 2));
      if (alpha != 1.0) out.mul_(alpha);
    } else {
      out.baddbmm_(xt, xt.transpose(1, 2), beta, alpha);
    }
    return;
  }
  if (cblas_syrk(out, x, trans, alpha, beta)) return;

  // Blocked: compute the upper block triangle with GEMMs, mirror the rest.
  const int64_t k = num_blocks(s);
  const int64_t step = (s + k - 1) / k;
  for (int64_t i0 = 0; i0 < s; i0 += step) {
    const int64_t ni = std::min(step, s - i0);
    auto xi = op_rows(x, trans, i0, ni);
    for (int64_t j0 = i0; j0 < s; j0 += step) {
      const int64_t nj = std::min(step, s - j0);
      auto xj = op_rows(x, trans, j0, nj);
      auto block = out.narrow(1, i0, ni).narrow(2, j0, nj);
      if (beta == 0.0) {
        auto prod = at::bmm(xi, xj.transpose(1, 2));
        if (alpha != 1.0) prod.mul_(alpha);
        block.copy_(prod);
      } else {
        block.copy_(at::baddbmm(block, xi, xj.transpose(1, 2), beta, alpha));
      }
      if (j0 != i0) out.narrow(1, j0, nj).narrow(2, i0, ni).copy_(block.transpose(1, 2));
    }
  }
}

}  // namespace muon::detail
