// Tests of muon::spectral_clip, spectral_hardcap and
// spectral_clipped_weight_decay (muon/spectral.h) against an fp64 SVD
// reference: U·f(Σ)·Vᵀ with f the clamp, the cap or the decay of each
// singular value.
//
// Tolerances come from the accuracy of the Newton–Schulz polar factor on
// the very matrices the functions take msign of: each test measures
// δ = ‖msign_NS(M) − polar(M)‖_F for X and for the inner matrix (σ·I − U·Σ·Uᵀ
// for the clip, β·O − X for the hardcap), with polar(M) exact from the
// construction. Every formula is a sum of at most three products in which
// one msign factor is multiplied by matrices of spectral norm at most
// ‖X‖₂ + max(|bounds|), so its error is at most
//   tol = 3·(‖X‖₂ + max|bound|)·(δ_X + δ_inner)  (+ the same again for the
// second inner msign of the clip). The singular values are chosen so that
// every σᵢ and every distance |σᵢ − bound| is at least 3% of the Frobenius
// norm of its matrix, well inside where 8 polar_express steps converge
// (≥ 1e-3): δ is then at the level of the compute dtype's rounding, and tol
// is asserted to be tiny against the smallest change a clip makes (0.1),
// so a wrong formula cannot pass.
#include <gtest/gtest.h>

#include "tensor_util.h"
#include "expect_util.h"

#include <algorithm>
#include <vector>

#include "muon/newton_schulz.h"
#include "muon/spectral.h"

namespace muon::test {
namespace {

// An m×n fp64 matrix with singular values `s` (k = min(m, n) of them) and
// random singular vectors.
Svd make(int64_t m, int64_t n, const std::vector<double>& s, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t k = std::min(m, n);
  Svd out;
  out.u = std::get<0>(at::linalg_qr(at::randn({m, k}, at::kDouble)));
  out.v = std::get<0>(at::linalg_qr(at::randn({n, k}, at::kDouble)));
  out.s = at::tensor(s, at::kDouble);
  return out;
}

// msign as muon/spectral.h computes it, in `dtype`.
at::Tensor ns_msign(const at::Tensor& m, at::ScalarType dtype) {
  NewtonSchulzOptions ns;
  ns.coefficients("polar_express").steps(8).compute_dtype(dtype);
  return newton_schulz(m.to(dtype), ns).to(at::kDouble);
}

double fro(const at::Tensor& t) { return t.norm().item<double>(); }

// δ of X's polar factor (U·Vᵀ).
double delta_x(const Svd& a, at::ScalarType dtype) {
  return fro(ns_msign(a.x(), dtype) - a.with(at::ones_like(a.s)));
}

// δ of the clip's inner msign(σ·I − U·Σ·Uᵀ) (in the wide orientation: U is
// the short side's basis), whose exact value is U·sign(σ − Σ)·Uᵀ.
double delta_inner_clip(const Svd& a, double sigma, at::ScalarType dtype) {
  const bool tall = a.u.size(0) > a.v.size(0);
  const auto& basis = tall ? a.v : a.u;
  const auto inner = sigma * at::eye(basis.size(0), at::kDouble) -
                     at::matmul(basis * a.s, basis.transpose(0, 1));
  const auto exact = at::matmul(basis * at::sign(sigma - a.s), basis.transpose(0, 1));
  return fro(ns_msign(inner, dtype) - exact);
}

// δ of the hardcap's inner msign(β·O − X) = U·sign(β − Σ)·Vᵀ.
double delta_inner_cap(const Svd& a, double beta, at::ScalarType dtype) {
  const auto inner = a.with(beta - a.s);
  return fro(ns_msign(inner, dtype) - a.with(at::sign(beta - a.s)));
}

const std::vector<double> kSingular{3.0, 2.2, 1.6, 0.6, 0.4, 0.25};

TEST(Spectral, ClipEqualsSvdReference) {
  const double lo = 0.5;
  const double hi = 1.2;
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{6, 10}, {10, 6}, {6, 6}}) {
    const auto a = make(m, n, kSingular, 5);
    const auto expected = a.with(at::clamp(a.s, lo, hi));
    const auto got = spectral_clip(a.x(), lo, hi);
    EXPECT_EQ(got.sizes(), a.x().sizes());
    EXPECT_EQ(got.scalar_type(), at::kDouble);
    const double tol = 3 * (3.0 + hi) *
                       (2 * delta_x(a, at::kDouble) + delta_inner_clip(a, lo, at::kDouble) +
                        delta_inner_clip(a, hi, at::kDouble));
    EXPECT_LT(tol, 1e-3);  // meaningful: every clipped value moves by ≥ 0.1
    EXPECT_LE(fro(got - expected), tol) << m << "x" << n;
    // The singular values of the result are the clamped ones.
    const auto sv = at::linalg_svdvals(got);
    EXPECT_TRUE(at::allclose(sv, std::get<0>(at::clamp(a.s, lo, hi).sort(0, true)), 0, tol));
  }
}

TEST(Spectral, ClipWithEqualBoundsIsScaledMsign) {
  // clamp(σ, s, s) = s: the clip is s·U·Vᵀ (the blog's sanity check).
  const auto a = make(5, 9, {2.0, 1.5, 1.0, 0.7, 0.35}, 8);
  const auto got = spectral_clip(a.x(), 0.8, 0.8);
  const double tol = 3 * (2.0 + 0.8) *
                     (2 * delta_x(a, at::kDouble) + 2 * delta_inner_clip(a, 0.8, at::kDouble));
  EXPECT_LE(fro(got - 0.8 * a.with(at::ones_like(a.s))), tol);
}

TEST(Spectral, HardcapEqualsSvdReference) {
  for (const double beta : {1.0, 0.5}) {
    for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{6, 10}, {10, 6}}) {
      // Singular values kept ≥ 0.1 away from both betas.
      const auto a = make(m, n, {3.0, 2.2, 1.6, 0.75, 0.3, 0.2}, 6);
      const auto expected = a.with(at::clamp_max(a.s, beta));
      const auto got = spectral_hardcap(a.x(), beta);
      const double tol = 3 * (3.0 + beta) * (2 * delta_x(a, at::kDouble) + delta_inner_cap(a, beta, at::kDouble));
      EXPECT_LT(tol, 1e-3);
      EXPECT_LE(fro(got - expected), tol) << m << "x" << n << " beta " << beta;
    }
  }
}

TEST(Spectral, ClippedWeightDecayEqualsSvdReference) {
  const double beta = 1.0;
  const double c = 0.3;
  const auto a = make(8, 6, kSingular, 7);
  // σ > β: (1 − c)·σ + c·β; σ ≤ β: σ.
  const auto expected = a.with(at::where(a.s > beta, (1 - c) * a.s + c * beta, a.s));
  const auto got = spectral_clipped_weight_decay(a.x(), beta, c);
  const double tol = c * 3 * (3.0 + beta) * (2 * delta_x(a, at::kDouble) + delta_inner_cap(a, beta, at::kDouble));
  EXPECT_LE(fro(got - expected), tol + 1e-12);
  // c = 0 leaves X as it is; c = 1 is the hardcap.
  EXPECT_TRUE(at::allclose(spectral_clipped_weight_decay(a.x(), beta, 0.0), a.x(), 0, 1e-14));
  EXPECT_TRUE(at::allclose(spectral_clipped_weight_decay(a.x(), beta, 1.0), spectral_hardcap(a.x(), beta), 0, 1e-14));
}

TEST(Spectral, BatchedFp32EqualsEachMatrixsSvdReference) {
  // A batch of two 6×10 matrices in fp32: each entry is its own matrix. The
  // δ are measured in fp32 too, so the bound includes fp32 rounding of NS.
  const auto a = make(6, 10, kSingular, 9);
  const auto b = make(6, 10, {2.8, 2.0, 1.4, 0.7, 0.45, 0.3}, 10);
  const auto x = at::stack({a.x(), b.x()}).to(at::kFloat);
  const double lo = 0.5;
  const double hi = 1.2;
  const auto clipped = spectral_clip(x, lo, hi);
  const auto capped = spectral_hardcap(x, 1.0);
  ASSERT_EQ(clipped.sizes(), x.sizes());
  EXPECT_EQ(clipped.scalar_type(), at::kFloat);
  for (int i = 0; i < 2; ++i) {
    const auto& s = i == 0 ? a : b;
    const double clip_tol = 3 * (3.0 + hi) *
                                (2 * delta_x(s, at::kFloat) + delta_inner_clip(s, lo, at::kFloat) +
                                 delta_inner_clip(s, hi, at::kFloat)) +
                            1e-6 * fro(s.x());  // the input's and output's fp32 rounding
    EXPECT_LT(clip_tol, 1e-2);
    EXPECT_LE(fro(clipped[i].to(at::kDouble) - s.with(at::clamp(s.s, lo, hi))), clip_tol) << i;
    const double cap_tol = 3 * (3.0 + 1.0) * (2 * delta_x(s, at::kFloat) + delta_inner_cap(s, 1.0, at::kFloat)) +
                           1e-6 * fro(s.x());
    EXPECT_LE(fro(capped[i].to(at::kDouble) - s.with(at::clamp_max(s.s, 1.0))), cap_tol) << i;
  }
}

TEST(Spectral, InvalidArgumentsAreNamed) {
  const auto x = at::randn({4, 6});
  expect_value_error([&] { spectral_clip(x, 1.0, 0.5); }, {"spectral_clip", "sigma_min", "1", "0.5"});
  expect_value_error([&] { spectral_clip(x, 0.0, NAN); }, {"sigma_max", "nan"});
  expect_value_error([&] { spectral_hardcap(x, -1.0); }, {"spectral_hardcap", "beta", "-1"});
  expect_value_error([&] { spectral_clipped_weight_decay(x, 1.0, 1.5); },
                     {"spectral_clipped_weight_decay", "c", "[0, 1]", "1.5"});
  expect_value_error([&] { spectral_hardcap(at::randn({6})); }, {"spectral_hardcap", "shape", "[6]"});
  expect_value_error([&] { spectral_clip(at::ones({3, 3}, at::kLong)); }, {"floating", "Long"});
}

}  // namespace
}  // namespace muon::test
