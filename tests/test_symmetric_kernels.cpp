// The symmetric-product kernels behind newton_schulz: CBLAS SYRK, the
// blocked (row-panel) path and one plain GEMM give the same full matrix;
// oneDNN's products (bf16 inputs with fp32 results, strided blocks,
// β·C + α·A·B) match fp64 references.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cpu_product_util.h"
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

// Max |A|·|B| entry, the scale of a product's rounding error.
double product_scale(const at::Tensor& a, const at::Tensor& b) {
  return at::mm(a.to(at::kDouble).abs(), b.to(at::kDouble).abs()).max().item<double>();
}

TEST(DnnlMatmul, MatchesFp64ProductOnStridedOperands) {
  if (!muon::detail::dnnl_matmul_available()) GTEST_SKIP() << "built without oneDNN";
  at::manual_seed(3);
  // K = 700 spans three fp32 chunks of 256 (the last one short).
  const int64_t m = 37, k = 700, n = 53;
  for (auto in : {at::kFloat, at::kBFloat16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, {-0.6, 2.5}}) {
          auto a = (ta ? at::randn({k, m}).t() : at::randn({m, k})).to(in);
          auto b = (tb ? at::randn({n, k}).t() : at::randn({k, n})).to(in);
          // The result is a block inside a larger fp32 matrix: the rest of
          // the matrix must stay untouched.
          auto big = at::randn({m + 4, n + 9});
          const auto before = big.clone();
          auto out = big.narrow(0, 2, m).narrow(1, 5, n);
          const auto c0 = out.clone();
          muon::test::cpu_product(out, a, b, alpha, beta);
          // bf16 inputs: products of bf16 values are exact in fp32, so the
          // reference is the fp64 product of the same (rounded) inputs and
          // only fp32 accumulation error remains: ≤ ~√k·2⁻²⁴ of |A|·|B|,
          // bounded here with a factor 8 over k·2⁻²⁴/√k.
          const auto ref = alpha * at::mm(a.to(at::kDouble), b.to(at::kDouble)) +
                           beta * c0.to(at::kDouble);
          const double tol = 8 * std::sqrt(static_cast<double>(k)) * std::ldexp(1.0, -24) *
                             (std::abs(alpha) * product_scale(a, b) +
                              std::abs(beta) * c0.abs().max().item<double>());
          EXPECT_LE((out.to(at::kDouble) - ref).abs().max().item<double>(), tol)
              << in << " ta=" << ta << " tb=" << tb << " alpha=" << alpha;
          auto outside = big.clone();
          outside.narrow(0, 2, m).narrow(1, 5, n).copy_(before.narrow(0, 2, m).narrow(1, 5, n));
          EXPECT_TRUE(at::equal(outside, before)) << "wrote outside its block";
        }
      }
    }
  }
}

TEST(DnnlMatmul, Bf16ResultsAndRefusals) {
  if (!muon::detail::dnnl_matmul_available()) GTEST_SKIP() << "built without oneDNN";
  auto a = at::randn({40, 64}).to(at::kBFloat16), b = at::randn({64, 24}).to(at::kBFloat16);
  auto out = at::empty({40, 24}, at::kBFloat16);
  muon::test::cpu_product(out, a, b, 1.0, 0.0);
  // One rounding to bf16 of the fp32-accumulated product.
  const auto ref = at::mm(a.to(at::kDouble), b.to(at::kDouble));
  EXPECT_LE((out.to(at::kDouble) - ref).abs().max().item<double>(),
            std::ldexp(1.0, -8) * ref.abs().max().item<double>() + 1e-6);
  // What it cannot take it refuses without touching out: mixed input
  // dtypes, fp64, a result without unit stride. (Accumulation into a bf16
  // result is taken: tests/test_ns_bf16.cpp.)
  auto keep = at::randn({40, 24}).to(at::kBFloat16);
  const auto copy = keep.clone();
  EXPECT_FALSE(muon::detail::dnnl_matmul(keep, a.to(at::kFloat), b, 1.0, 0.0, 1));
  auto d = at::zeros({40, 24}, at::kDouble);
  EXPECT_FALSE(muon::detail::dnnl_matmul(d, a.to(at::kDouble), b.to(at::kDouble), 1.0, 0.0, 1));
  auto col_major = at::zeros({24, 40}).t();
  EXPECT_FALSE(muon::detail::dnnl_matmul(col_major, a.to(at::kFloat), b.to(at::kFloat), 1.0,
                                         0.0, 1));
  EXPECT_TRUE(at::equal(keep, copy));
}

TEST(SymmetricKernels, Bf16ProductsFollowTheCpu) {
  // oneDNN's bf16 matmul is used where it is native (AVX512_CORE_BF16, AMX);
  // at AVX512_CORE and AVX512_CORE_VNNI it is emulated and slower than fp32,
  // on AVX2 it does not exist: bf16 is widened there. The choice must agree
  // with the ISA oneDNN runs at (the CPU's, or ONEDNN_MAX_CPU_ISA's).
  // (oneDNN 3.x also has a native one on AVX2_VNNI_2, which 2.x cannot
  // name: levels between AVX2 and AVX512_CORE are not asserted.)
  using muon::detail::Bf16Products;
  const std::string isa = muon::detail::dnnl_isa_name();
  const bool native = isa == "AVX512_CORE_BF16" || isa == "AVX512_CORE_AMX";
  const bool widened = isa == "AVX512_CORE" || isa == "AVX512_CORE_VNNI" || isa == "AVX2" ||
                       isa == "AVX" || isa == "SSE41" || isa.empty();
  if (!muon::detail::dnnl_matmul_available() || widened) {
    EXPECT_EQ(muon::detail::bf16_products(), Bf16Products::kWidened) << "oneDNN ISA " << isa;
  } else if (native) {
    EXPECT_EQ(muon::detail::bf16_products(), Bf16Products::kOneDnn) << "oneDNN ISA " << isa;
  }
  const auto said = muon::detail::describe_cpu_products(at::kBFloat16);
  EXPECT_NE(said.find(muon::detail::bf16_products() == Bf16Products::kOneDnn ? "oneDNN bf16 matmul"
                                                                              : "widened to fp32"),
            std::string::npos)
      << said;
  if (muon::detail::bf16_products() != Bf16Products::kWidened) return;
  // Widened: exactly the fp32 product of the widened operands (the same
  // fp32 kernel), rounded once; bf16 results and fp32 results alike.
  at::manual_seed(8);
  const auto a = at::randn({2, 70, 300}).to(at::kBFloat16);
  const auto b = at::randn({2, 300, 50}).to(at::kBFloat16);
  auto c = at::randn({2, 70, 50}).to(at::kBFloat16);
  auto out = c.clone();
  muon::detail::batched_addmm_out(out, c, a, b, 1.25, 1.0);
  auto ref = c.to(at::kFloat);
  muon::detail::batched_addmm_out(ref, ref, a.to(at::kFloat), b.to(at::kFloat), 1.25, 1.0);
  EXPECT_TRUE(at::equal(out, ref.to(at::kBFloat16)));
  auto out32 = at::empty({2, 70, 50});
  muon::detail::batched_mm_out(out32, a, b);
  auto ref32 = at::empty({2, 70, 50});
  muon::detail::batched_mm_out(ref32, a.to(at::kFloat), b.to(at::kFloat));
  EXPECT_TRUE(at::equal(out32, ref32));
}

TEST(SymmetricKernels, RoundToBf16ValuesIsLibTorchsConversion) {
  // In place, on fp32 tensors that carry bf16 values: the same bits as
  // LibTorch's fp32 -> bf16 -> fp32 (nearest, ties to even) on random
  // values, exact ties (odd and even), values that round up into the next
  // binade or to infinity, subnormals, ±0, ±inf; NaN stays NaN.
  at::manual_seed(12);
  auto t = at::cat({at::randn({5000}) * 1e3, at::randn({3000}) * 1e-39,
                    at::tensor({1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 512,
                                1.0f + 3.0f / 512, 0.0f, -0.0f, 3.3895313892515355e38f,
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(), 1.9999999f, -1.9999999f})});
  const auto expected = t.to(at::kBFloat16).to(at::kFloat);
  auto rounded = t.clone();
  muon::detail::round_to_bf16_values(rounded);
  EXPECT_TRUE(at::equal(rounded, expected));
  auto nan = at::full({3}, std::nanf(""));
  muon::detail::round_to_bf16_values(nan);
  EXPECT_TRUE(nan.isnan().all().item<bool>());
}

TEST(SymmetricKernels, Bf16InputsGiveFp32GramSymmetricToTheBit) {
  at::manual_seed(4);
  for (int64_t s : {5, 200, 300}) {
    for (bool trans : {false, true}) {
      auto x = (trans ? at::randn({1, 3 * s, s}) : at::randn({1, s, 3 * s})).to(at::kBFloat16);
      auto out = at::empty({1, s, s}, muon::detail::accumulates_in_fp32(x) ? at::kFloat
                                                                            : at::kBFloat16);
      syrk(out, x, trans, 1.0, 0.0, /*symmetric_kernels=*/true);
      EXPECT_TRUE(at::equal(out, out.transpose(1, 2))) << "s=" << s;
      auto op = (trans ? x.transpose(1, 2) : x).to(at::kDouble);
      const auto ref = at::bmm(op, op.transpose(1, 2));
      const double u = out.scalar_type() == at::kFloat ? std::ldexp(1.0, -24) : 4e-3;
      EXPECT_LE((out.to(at::kDouble) - ref).abs().max().item<double>(),
                8 * u * std::sqrt(3.0 * s) * ref.abs().max().item<double>())
          << "s=" << s << " trans=" << trans;
    }
  }
}

TEST(SymmetricKernels, UpperProductThenSymmetricRounding) {
  at::manual_seed(5);
  const int64_t s = 260, l = 300;
  auto x = at::randn({2, s, l});
  auto upper = at::full({2, s, s}, std::nan(""));  // lower triangle never read
  muon::detail::syrk_upper(upper, x, /*trans=*/false, 1.0, 0.0);
  auto out = at::empty({2, s, s}, at::kBFloat16);
  muon::detail::symmetric_from_upper(out, upper, 0.5);
  auto expected = at::bmm(x.to(at::kDouble), x.to(at::kDouble).transpose(1, 2));
  expected.diagonal(0, 1, 2).add_(0.5);
  EXPECT_TRUE(at::equal(out, out.transpose(1, 2)));
  EXPECT_FALSE(at::isnan(out).any().item<bool>());
  // One rounding to bf16 dominates (2⁻⁹ relative, 2⁻⁸ to be safe).
  EXPECT_LE((out.to(at::kDouble) - expected).abs().max().item<double>(),
            std::ldexp(1.0, -8) * expected.abs().max().item<double>());
}

}  // namespace

TEST(SymmetricKernels, MirrorCopiesTheUpperTriangleExactly) {
  // Every size class of the tiled mirror: below one 4×4 block, ragged 4×4
  // blocks, ragged 64-wide tiles; fp32 takes the in-register transposes.
  at::manual_seed(5);
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    for (int64_t s : {1, 3, 4, 5, 63, 64, 65, 130}) {
      auto m = at::randn({2, s, s}).to(dtype);
      const auto upper = m.triu();
      const auto expected = upper + upper.triu(1).transpose(1, 2);
      muon::detail::mirror_upper_to_lower(m);
      EXPECT_TRUE(at::equal(m, expected)) << dtype << " s=" << s;
    }
  }
}
