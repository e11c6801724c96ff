#pragma once
// The library's CPU matrix product as the kernel tests reach it.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "kernels/symmetric.h"

namespace muon::test {

/// out = beta·out + alpha·a·b (2-D; out may be a block of a larger matrix)
/// through oneDNN's matmul where it takes the case. bf16 inputs where
/// oneDNN has no bf16 matmul (AVX2): dnnl_matmul must refuse them touching
/// nothing, and the library's product widens them to fp32 instead
/// (detail::Bf16Products::kWidened), which is what is then tested.
inline void cpu_product(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, double alpha,
                        double beta) {
  const auto before = out.clone();
  if (detail::dnnl_matmul(out, a, b, alpha, beta, 1)) {
    EXPECT_TRUE(a.scalar_type() != at::kBFloat16 ||
                detail::bf16_products() == detail::Bf16Products::kOneDnn)
        << "oneDNN took a bf16 product its probe said it has no kernel for";
    return;
  }
  ASSERT_TRUE(a.scalar_type() == at::kBFloat16 &&
              detail::bf16_products() == detail::Bf16Products::kWidened)
      << "oneDNN refused a " << a.scalar_type() << " product it has a kernel for";
  // (out may hold NaNs from at::empty: equal means equal or both NaN.)
  ASSERT_TRUE(((out == before) | (out.isnan() & before.isnan())).all().item<bool>())
      << "a refused product wrote its result";
  auto out3 = out.unsqueeze(0);
  detail::batched_addmm_out(out3, out3, a.unsqueeze(0), b.unsqueeze(0), beta, alpha);
}

}  // namespace muon::test
