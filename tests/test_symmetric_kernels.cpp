// The symmetric-product kernels behind newton_schulz: CBLAS SYRK, the
// blocked generic path and one plain GEMM give the same full matrix.
#include <gtest/gtest.h>

#include "kernels/symmetric.h"

namespace {

using muon::detail::syrk;

// op(X)·op(X)ᵀ·alpha + beta·C0, plainly in fp64.
at::Tensor reference(const at::Tensor& x, bool trans, double alpha, double beta,
                     const at::Tensor& c0) {
  auto xd = x.to(at::kDouble);
  auto op = trans ? xd.transpose(1, 2) : xd;
  return alpha * at::bmm(op, op.transpose(1, 2)) + beta * c0.to(at::kDouble);
}

TEST(SymmetricKernels, SyrkMatchesPlainProduct) {
  at::manual_seed(1);
  // Sizes cover 1 block, 2 uneven blocks, and s = 1.
  for (int64_t s : {1, 7, 100, 777}) {
    for (bool trans : {false, true}) {
      for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
        for (bool symmetric : {true, false}) {
          for (auto [alpha, beta] : {std::pair{1.0, 0.0}, {-0.7, 1.3}}) {
            const int64_t l = 2 * s + 3;
            auto x = trans ? at::randn({2, l, s}) : at::randn({2, s, l});
            x = x.to(dtype);
            auto c0 = at::randn({2, s, s}).to(dtype);
            c0 = c0 + c0.transpose(1, 2);  // symmetric, as in Newton–Schulz
            auto out = c0.clone();
            syrk(out, x, trans, alpha, beta, symmetric);
            const auto ref = reference(x, trans, alpha, beta, c0);
            // Dot products of length l in the dtype: relative error ≤ ~l·u
            // for sums of mixed-sign terms scaled by ‖x‖², bounded here by
            // comparing to the magnitude of |op(X)|·|op(X)|ᵀ.
            const double u = dtype == at::kDouble ? 1e-15 : dtype == at::kFloat ? 6e-8 : 4e-3;
            auto opx = (trans ? x.transpose(1, 2) : x).to(at::kDouble).abs();
            const double scale = (at::bmm(opx, opx.transpose(1, 2)).max().item<double>() *
                                      std::abs(alpha) +
                                  std::abs(beta) * c0.to(at::kDouble).abs().max().item<double>());
            const double err = (out.to(at::kDouble) - ref).abs().max().item<double>();
            EXPECT_LE(err, 4 * u * scale * std::sqrt(static_cast<double>(l)) + 1e-30)
                << "s=" << s << " trans=" << trans << " " << dtype << " sym=" << symmetric;
            // Symmetric to the bit: the lower triangle is a copy.
            if (symmetric) {
              EXPECT_TRUE(at::equal(out, out.transpose(1, 2)));
            }
          }
        }
      }
    }
  }
}

TEST(SymmetricKernels, MirrorCopiesUpperOntoLower) {
  auto m = at::arange(3 * 130 * 130, at::kFloat).reshape({3, 130, 130});
  auto expected = m.triu() + m.triu(1).transpose(1, 2);
  muon::detail::mirror_upper_to_lower(m);
  EXPECT_TRUE(at::equal(m, expected));
}

TEST(SymmetricKernels, BatchedMatmulMatchesBmm) {
  auto a = at::randn({3, 20, 30}), b = at::randn({3, 30, 10});
  auto out = at::empty({3, 20, 10});
  muon::detail::batched_mm_out(out, a, b);
  EXPECT_TRUE(at::allclose(out, at::bmm(a, b), 1e-5, 1e-5));
}

}  // namespace
