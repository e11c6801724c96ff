#pragma once
// t ← t·factor, the factor and the product in fp32 (at least), rounded once
// to t's dtype.
//
// ATen's in-place multiply by a Scalar rounds the factor to the tensor's own
// dtype first when that is bf16 or fp16: a weight decay factor 1 − lr·wd =
// 0.99 becomes 0.98828125 in bf16 (a decay of 0.0117, not 0.01), a momentum
// of 0.95 becomes 0.94921875. torch's Python optimizers (torch >= 2.x) keep
// the factor in fp32; this does the same on every LibTorch.
#include <ATen/core/Tensor.h>

namespace muon::detail {

inline void scale_(at::Tensor& t, double factor) {
  const auto dtype = t.scalar_type();
  if (dtype == at::kBFloat16 || dtype == at::kHalf) {
    t.copy_(t.to(at::kFloat).mul_(factor));
  } else {
    t.mul_(factor);
  }
}

}  // namespace muon::detail
