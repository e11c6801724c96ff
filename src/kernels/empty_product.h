// out ← β·out for a product whose inner dimension is empty (k = 0): the sum
// over k has no terms, so only the β term is left (β = 0: zeros, also over
// NaN in out, as BLAS does). Shared by the oneDNN and cuBLAS products.
#pragma once

#include <ATen/ATen.h>

namespace muon::detail {

inline void scale_empty_product(at::Tensor& out, double beta) {
  if (beta == 0.0) {
    out.zero_();
  } else {
    out.mul_(beta);
  }
}

}  // namespace muon::detail
