// Tests of muon::newton_schulz against independent references:
//  - the same coefficient schedule evaluated plainly in fp64 (reference.h),
//  - the exact polar factor from an fp64 SVD, and the scalar polynomial map
//    that the iteration applies to each singular value,
//  - the band each coefficient set maps [1e-3, 1] into, as literals.
#include <gtest/gtest.h>

#include <muon/newton_schulz.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "expect_util.h"
#include "reference.h"

namespace {

using muon::NewtonSchulzMethod;
using muon::NewtonSchulzOptions;

using muon::test::reference_newton_schulz;

double rel_err(const at::Tensor& y, const at::Tensor& ref) {
  const auto d = y.to(at::kDouble) - ref.to(at::kDouble);
  const double n = ref.to(at::kDouble).norm().item<double>();
  return d.norm().item<double>() / std::max(n, 1e-300);
}

// Random matrix with singular values log-spaced in [lo, 1] (fp64), built
// from random orthogonal factors.
at::Tensor with_spectrum(int64_t m, int64_t n, double lo, int64_t seed) {
  at::manual_seed(seed);
  const int64_t k = std::min(m, n);
  auto u = std::get<0>(at::linalg_qr(at::randn({m, k}, at::kDouble)));
  auto v = std::get<0>(at::linalg_qr(at::randn({n, k}, at::kDouble)));
  auto s = at::logspace(std::log10(lo), 0.0, k, 10.0, at::kDouble);
  return at::mm(u * s, v.t());
}

struct Shape {
  std::vector<int64_t> dims;
};

const std::vector<std::vector<int64_t>>& test_shapes() {
  static const std::vector<std::vector<int64_t>> shapes = {
      {48, 48}, {32, 112}, {112, 32}, {1, 40}, {40, 1}, {3, 24, 72}, {2, 72, 24}};
  return shapes;
}

// ---------------------------------------------------------------------------
// Against the fp64 schedule. Tolerance: the library evaluates the same
// polynomial schedule as the textbook formula, differing only by rounding,
// so its error against fp64 must be of the order of the textbook formula's
// own error in the same dtype. The standard method may be at most 2× that
// error (different but equally valid summation orders). Gram accumulates
// the s×s polynomial Q over up to three steps before applying it, so one
// rounding of Q is amplified by up to three step polynomials instead of one
// (measured up to 2.3× the plain error on square Gaussian inputs on an
// Intel CPU): it may be at most 4× (16× in fp32, see below). All get a
// floor of 8 units of roundoff (fp32: 8·2⁻²⁴, bf16: 8·2⁻⁸) for inputs
// where the plain error is tiny.
// ---------------------------------------------------------------------------
class AgainstFp64
    : public ::testing::TestWithParam<std::tuple<std::string, NewtonSchulzMethod, at::ScalarType>> {
};

TEST_P(AgainstFp64, MatchesSchedule) {
  const auto& [set, method, dtype] = GetParam();
  int64_t seed = 0;
  for (const auto& shape : test_shapes()) {
    at::manual_seed(++seed);
    // A vector's single normalized singular value is exactly 1/safety, the
    // edge of the maps' design range, where some are violently
    // ill-conditioned (cans: σ₀ = 1 ends at 1.0003, σ₀ = 0.999 at 0.92), so
    // the last bits of any evaluation decide the magnitude. Vectors are
    // tested in VectorsNormalizeToUnitLength and VectorsKeepDirection.
    if (std::min(shape[shape.size() - 2], shape.back()) == 1) continue;
    // Gaussian inputs, and the decaying spectra of real momentum matrices
    // (log-spaced σ down to 1e-3), where rounding of the a·X term matters.
    for (bool decaying : {false, true}) {
    auto g = at::randn(shape, at::kDouble);
    if (decaying) {
      auto svd = at::linalg_svd(g, /*full_matrices=*/false);
      const auto k = std::min(g.size(-2), g.size(-1));
      const auto sv = at::logspace(-3.0, 0.0, k, 10.0, at::kDouble);
      g = at::matmul(std::get<0>(svd) * sv, std::get<2>(svd));
    }
    auto o = NewtonSchulzOptions().coefficients(set).method(method).compute_dtype(dtype);
    const auto ref = reference_newton_schulz(g, o, at::kDouble);
    const auto plain = reference_newton_schulz(g, o, dtype);
    const auto ours = muon::newton_schulz(g.to(at::kFloat), o);
    ASSERT_EQ(ours.sizes(), g.sizes());
    ASSERT_EQ(ours.scalar_type(), at::kFloat);
    const bool gram = muon::resolve_method(g.size(-2), g.size(-1), o) == NewtonSchulzMethod::kGram;
    const double unit = dtype == at::kFloat ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
    // Explicit Gram in fp32: R = X·Xᵀ squares the condition number, so a
    // direction of singular value σ takes rounding relative to σ² rather
    // than σ, and its error over the standard iteration's grows with the
    // input's conditioning and the BLAS's summation order rather than by a
    // fixed factor. Measured: up to 9× on decaying spectra (cans, 112×32,
    // σ down to 1e-3), and on square Gaussians up to 2.3× on an Intel CPU
    // but 4.6× on an AMD EPYC with AVX2 only under torch 2.11
    // (polar_express, 48×48). Auto never picks Gram in fp32. 16× guards
    // its structure: a wrong restart or a dropped term gives O(1) errors,
    // 1e4× above it.
    const double factor = !gram ? 2.0 : dtype == at::kFloat ? 16.0 : 4.0;
    const double tol = factor * rel_err(plain, ref) + 8 * unit;
    EXPECT_LE(rel_err(ours, ref), tol)
        << set << " " << muon::to_string(method) << " " << dtype << " shape " << at::IntArrayRef(shape)
        << (decaying ? " decaying" : " gaussian") << " plain err " << rel_err(plain, ref);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sets, AgainstFp64,
    ::testing::Combine(::testing::Values("simple", "quintic", "polar_express", "polar_express_5",
                                         "cans", "aol", "deepseekv4", "cubic", "cubic5"),
                       ::testing::Values(NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram,
                                         NewtonSchulzMethod::kAuto),
                       ::testing::Values(at::kFloat)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + muon::to_string(std::get<1>(info.param));
    });

INSTANTIATE_TEST_SUITE_P(
    Bf16, AgainstFp64,
    ::testing::Combine(::testing::Values("simple", "quintic", "polar_express_5"),
                       ::testing::Values(NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram,
                                         NewtonSchulzMethod::kAuto),
                       ::testing::Values(at::kBFloat16)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + muon::to_string(std::get<1>(info.param)) + "_bf16";
    });

TEST(NewtonSchulz, Fp64ComputeMatchesScheduleToRoundoff) {
  // fp64 compute: the only difference from the fp64 reference is summation
  // order, ~1e-13 relative after a few amplifying steps.
  at::manual_seed(3);
  const auto g = at::randn({40, 90}, at::kDouble);
  for (auto method : {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram}) {
    auto o = NewtonSchulzOptions().compute_dtype(at::kDouble).method(method);
    const auto ours = muon::newton_schulz(g, o);
    EXPECT_EQ(ours.scalar_type(), at::kDouble);
    EXPECT_LE(rel_err(ours, reference_newton_schulz(g, o, at::kDouble)), 1e-11)
        << muon::to_string(method);
  }
}

// ---------------------------------------------------------------------------
// Against the exact polar factor (fp64 SVD). NS maps every singular value σ
// of the normalized input through the same scalar odd polynomial, keeping
// the singular vectors: X = U·p(Σ/‖G‖)·Vᵀ.
// ---------------------------------------------------------------------------

// The band of each set's scalar map over [1e-3, 1], as literals written to a
// few digits independently of the library's coefficient tables, with half a
// unit of their last digit.
struct Band {
  const char* set;
  int64_t steps;
  double lo;
  double hi;
  double quoted;  // half a unit of the last digit of lo and hi
};
const Band kBands[] = {
    {"simple", 5, 0.47, 1.20, 5e-3},         {"quintic", 5, 0.475, 1.145, 5e-4},
    {"polar_express_5", 5, 0.847, 1.141, 5e-4}, {"polar_express", 8, 1.0, 1.0, 5e-5},
    {"cubic", 10, 0.058, 1.0, 5e-4},           {"cubic5", 5, 0.119, 1.300, 5e-4},
};

double scalar_map(double sigma, const NewtonSchulzOptions& o) {
  double x = sigma / o.coefficients().safety_factor;
  for (const auto& k : o.schedule()) x = k.a * x + k.b * x * x * x + k.c * x * x * x * x * x;
  return x;
}

// [min, max] of the scalar map over a fine log grid of [1e-3, 1].
std::pair<double, double> scalar_band(const NewtonSchulzOptions& o) {
  double lo = 1e9, hi = -1e9;
  for (int i = 0; i <= 20000; ++i) {
    const double v = scalar_map(std::pow(10.0, -3.0 + 3.0 * i / 20000), o);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return {lo, hi};
}

TEST(NewtonSchulzPolar, CoefficientTablesReproduceReferenceBands) {
  // Checks the coefficient values themselves: their scalar map spans the
  // bands above, to the digits they are written with.
  for (const auto& band : kBands) {
    const auto [lo, hi] = scalar_band(NewtonSchulzOptions().coefficients(band.set).steps(band.steps));
    EXPECT_NEAR(lo, band.lo, band.quoted) << band.set;
    EXPECT_NEAR(hi, band.hi, band.quoted) << band.set;
  }
}

TEST(NewtonSchulzPolar, SingularValuesFollowScalarMapAndBands) {
  // Input spectrum log-spaced so that the normalized singular values span
  // [~1e-3, ~0.5]. The fp32 output's singular values must equal the fp64
  // scalar map of the normalized input values (both sorted: the map is not
  // monotone) to 2e-3 absolute — fp32 roundoff amplified by the
  // polynomial's slope (≤ ~10 per step at small σ) stays far below this —
  // and lie in the set's band.
  const int64_t m = 48, n = 96;
  const auto g = with_spectrum(m, n, 4e-3, 11);
  const auto s_in = at::linalg_svdvals(g);
  const double fro = g.norm().item<double>();
  for (const auto& band : kBands) {
    for (auto method : {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram}) {
      auto o = NewtonSchulzOptions().coefficients(band.set).steps(band.steps).method(method);
      const auto [lo, hi] = scalar_band(o);
      const double safety = o.coefficients().safety_factor;
      std::vector<double> expected;
      for (int64_t i = 0; i < m; ++i) {
        // σ of the normalized input, expressed before the safety factor
        // (scalar_map divides by it, as the bands above are defined).
        const double sig = s_in[i].item<double>() / (fro * safety + o.eps()) * safety;
        ASSERT_GE(sig, 1e-3) << "test precondition: normalized σ in [1e-3, 1]";
        expected.push_back(scalar_map(sig, o));
      }
      std::sort(expected.rbegin(), expected.rend());
      const auto x = muon::newton_schulz(g.to(at::kFloat), o).to(at::kDouble);
      const auto s_out = at::linalg_svdvals(x);
      for (int64_t i = 0; i < m; ++i) {
        const double got = s_out[i].item<double>();
        EXPECT_NEAR(got, expected[static_cast<size_t>(i)], 2e-3) << band.set << " i=" << i;
        EXPECT_GE(got, lo - 2e-3) << band.set;
        EXPECT_LE(got, hi + 2e-3) << band.set;
      }
    }
  }
}

TEST(NewtonSchulzPolar, PolarExpress8ReachesPolarFactor) {
  // polar_express (the paper's 8 steps) converges: within 1e-2 of U·Vᵀ in
  // spectral norm, for wide, tall and square inputs with singular values
  // spanning 1e-3 (after normalization).
  for (auto [m, n] : {std::pair<int64_t, int64_t>{48, 96}, {96, 48}, {64, 64}}) {
    const auto g = with_spectrum(m, n, 4e-3, m + n);
    auto svd = at::linalg_svd(g, /*full_matrices=*/false);
    const auto polar = at::mm(std::get<0>(svd), std::get<2>(svd));
    for (auto dtype : {at::kFloat, at::kDouble}) {
      const auto x = muon::newton_schulz(
          g.to(dtype), NewtonSchulzOptions().coefficients("polar_express").compute_dtype(dtype));
      const double err = at::linalg_matrix_norm(x.to(at::kDouble) - polar, 2).item<double>();
      EXPECT_LE(err, 1e-2) << m << "x" << n << " " << dtype;
    }
  }
}

// ---------------------------------------------------------------------------
// Paths agree: Gram, SYRK and plain GEMMs, batched and per-matrix. All are
// evaluations of one schedule; in fp32 they agree to a few times the fp32
// error of the textbook formula (measured here on the same input).
// ---------------------------------------------------------------------------
// An upper estimate of the relative (Frobenius) error of an fp32 evaluation
// of `options`' schedule on `g` against the exact result, to first order in
// fp32's unit roundoff u = 2^-24, from the arithmetic alone (no measured
// error, so it holds whatever the BLAS kernels and their summation order).
//
// Exact Newton–Schulz maps each singular value σ of X₀ = G/(‖G‖_F·safety) by
// the scalar maps f_k(σ) = aσ + bσ³ + cσ⁵; the output is U·P(Σ)·Vᵀ with P
// their composition. A relative error δ in the k-th iterate σ_k reaches the
// output multiplied by ∏_{j>k} L_j, with L_j = |σ_j f_j'(σ_j) / f_j(σ_j)| the
// relative condition number of map j at its iterate. The errors made:
//  - the norm: a sum of m·n squares, relative error ≤ (√(mn) + 2)·u (sums of
//    N terms in any order err by ~√N·u: the probabilistic bound of Higham &
//    Mary, SIAM J. Sci. Comput. 2019, which blocked and SIMD BLAS kernels
//    obey; +2 for the square root and the division);
//  - step k: the inner products of XXᵀ, (XXᵀ)² and BX are sums of ≤ n terms
//    (n the long side), the polynomial adds terms of sizes |a|σ, |b|σ³, |c|σ⁵
//    to a result of size |f_k(σ)|: relative error ≤ c_k·(√n + 2)·u with
//    c_k = (|a|σ + |b|σ³ + |c|σ⁵)/|f_k(σ)| (cancellation: 36 in polar
//    express' first step at the top of the range).
// Each singular value's error E(σ) sums these terms through the later
// maps; the Frobenius error weights them by the output P(σ). Vectors sit at
// σ₀ = 1/safety, where the maps amplify most (∏L ≈ 175 for polar_express_5):
// their errors are ~10x a Gaussian matrix's, with any kernel.
double ns_rounding_bound(const at::Tensor& g, const NewtonSchulzOptions& options) {
  if (g.dim() == 3) {  // a batch: the worst of its matrices
    double worst = 0;
    for (int64_t i = 0; i < g.size(0); ++i) worst = std::max(worst, ns_rounding_bound(g[i], options));
    return worst;
  }
  constexpr double u = 0x1p-24;
  const auto x = g.to(at::kDouble);
  const double m = static_cast<double>(std::min(x.size(-2), x.size(-1)));
  const double n = static_cast<double>(std::max(x.size(-2), x.size(-1)));
  const auto sigma =
      at::linalg_svdvals(x / (x.norm() * options.coefficients().safety_factor)).contiguous();
  double num = 0, den = 0;
  for (int64_t i = 0; i < sigma.numel(); ++i) {
    double s = sigma[i].item<double>();
    if (s < 1e-12) continue;
    double e = (std::sqrt(m * n) + 2) * u;  // relative error of σ, carried forward
    for (const auto& k : options.schedule()) {
      const double f = k.a * s + k.b * s * s * s + k.c * s * s * s * s * s;
      const double df = k.a + 3 * k.b * s * s + 5 * k.c * s * s * s * s;
      const double cancellation =
          (std::abs(k.a * s) + std::abs(k.b * s * s * s) + std::abs(k.c * s * s * s * s * s)) /
          std::abs(f);
      e = e * std::abs(s * df / f) + cancellation * (std::sqrt(n) + 2) * u;
      s = f;
    }
    num += (s * e) * (s * e);
    den += s * s;
  }
  return std::sqrt(num / den);
}

TEST(NewtonSchulzPaths, AllMethodsAgree) {
  // Every method evaluates the same schedule, so each is within the fp32
  // rounding bound E of the exact result (the fp64 reference), and two of them
  // within 2E of each other. Gram accumulates up to three steps' polynomials
  // in the small Gram-side factor Q before applying it to X, so a rounding
  // made in Q passes through up to three more products: 3E.
  for (const auto& shape : test_shapes()) {
    at::manual_seed(7);
    const auto g = at::randn(shape);
    auto base = NewtonSchulzOptions().coefficients("polar_express_5");
    const auto ref = reference_newton_schulz(g.to(at::kDouble), base, at::kDouble);
    const double bound = ns_rounding_bound(g, base);
    // Small enough to tell: an fp32 evaluation that is off by one bf16
    // rounding (2^-9) anywhere, as from a wrong compute dtype, is not within it.
    ASSERT_LT(bound, 1e-3) << at::IntArrayRef(shape);
    const auto standard = muon::newton_schulz(g, NewtonSchulzOptions(base).method("standard"));
    const auto no_syrk =
        muon::newton_schulz(g, NewtonSchulzOptions(base).method("standard").symmetric(false));
    const auto gram = muon::newton_schulz(g, NewtonSchulzOptions(base).method("gram"));
    const auto gram_gemm =
        muon::newton_schulz(g, NewtonSchulzOptions(base).method("gram").symmetric(false));
    const auto bf16 = muon::newton_schulz(g, NewtonSchulzOptions(base).compute_dtype(at::kBFloat16));
    EXPECT_LE(rel_err(standard, ref), bound) << at::IntArrayRef(shape);
    EXPECT_LE(rel_err(no_syrk, ref), bound) << at::IntArrayRef(shape);
    EXPECT_LE(rel_err(standard, no_syrk), 2 * bound) << at::IntArrayRef(shape);
    EXPECT_LE(rel_err(gram, ref), 3 * bound) << at::IntArrayRef(shape);
    EXPECT_LE(rel_err(gram_gemm, ref), 3 * bound) << at::IntArrayRef(shape);
    EXPECT_LE(rel_err(standard, gram), 4 * bound) << at::IntArrayRef(shape);
    EXPECT_GT(rel_err(bf16, ref), 3 * bound) << at::IntArrayRef(shape);
  }
}

TEST(NewtonSchulzPaths, BatchEqualsPerMatrix) {
  at::manual_seed(8);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (auto method : {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram}) {
      const auto g = at::randn({4, 40, 100});
      auto o = NewtonSchulzOptions().compute_dtype(dtype).method(method);
      const auto batched = muon::newton_schulz(g, o);
      for (int64_t i = 0; i < 4; ++i) {
        // The same kernels run per matrix either way: equal to the bit in
        // fp32 on CPU; bf16 allows one rounding difference per element.
        const auto single = muon::newton_schulz(g[i], o);
        EXPECT_LE(rel_err(batched[i], single), dtype == at::kFloat ? 1e-6 : 1e-2);
      }
    }
  }
}

TEST(NewtonSchulzPaths, AutoPicksGramForWide16BitMatrices) {
  // fp32/fp64: always standard (its error equals the plain formula's; Gram's
  // does not on ill-conditioned inputs). 16-bit: Gram for wide matrices.
  NewtonSchulzOptions o;
  auto bf16 = NewtonSchulzOptions().compute_dtype(at::kBFloat16);
  EXPECT_EQ(muon::resolve_method(768, 3072, o), NewtonSchulzMethod::kStandard);
  EXPECT_EQ(muon::resolve_method(768, 3072, NewtonSchulzOptions(o).compute_dtype(at::kDouble)),
            NewtonSchulzMethod::kStandard);
  EXPECT_EQ(muon::resolve_method(768, 3072, bf16), NewtonSchulzMethod::kGram);
  EXPECT_EQ(muon::resolve_method(3072, 768, bf16), NewtonSchulzMethod::kGram);
  EXPECT_EQ(muon::resolve_method(2048, 2048, bf16), NewtonSchulzMethod::kStandard);
  EXPECT_EQ(muon::resolve_method(1000, 2000, bf16), NewtonSchulzMethod::kStandard);
  EXPECT_EQ(muon::resolve_method(768, 3072, NewtonSchulzOptions(bf16).steps(2)),
            NewtonSchulzMethod::kStandard);
  EXPECT_EQ(muon::resolve_method(768, 3072, NewtonSchulzOptions(bf16).method("standard")),
            NewtonSchulzMethod::kStandard);
  EXPECT_EQ(muon::resolve_method(64, 64, NewtonSchulzOptions(o).method("gram")),
            NewtonSchulzMethod::kGram);
}

TEST(NewtonSchulzPaths, Bf16NoLessAccurateThanPlainBf16Formula) {
  // The accuracy half of the speed target: at equal schedule, the bf16 error
  // of each method where auto uses it against the fp64 schedule is at most the textbook bf16
  // formula's, on the spectra where 16-bit Newton–Schulz is hardest:
  // log-spaced singular values down to 1e-3, and a low-rank-like decay
  // down to 1e-12 (σ_i = t_i² for t log-spaced in [1e-6, 1]).
  for (auto [m, n] : {std::pair<int64_t, int64_t>{128, 512}, {512, 128}, {96, 96}}) {
    for (bool low_rank : {false, true}) {
      auto g = with_spectrum(m, n, 1e-3, m + 2 * n + low_rank);
      if (low_rank) {
        auto svd = at::linalg_svd(g, false);
        const auto t = at::logspace(-6.0, 0.0, std::min(m, n), 10.0, at::kDouble);
        g = at::mm(std::get<0>(svd) * (t * t), std::get<2>(svd));
      }
      for (const char* set : {"quintic", "polar_express_5"}) {
        for (auto method : {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram,
                            NewtonSchulzMethod::kAuto}) {
          // Gram only where auto would choose it: forced onto a square bf16
          // matrix it is less accurate than the plain formula (documented).
          const bool wide = std::max(m, n) >= muon::kGramMinAspect * std::min(m, n);
          if (method == NewtonSchulzMethod::kGram && !wide) continue;
          auto o = NewtonSchulzOptions().coefficients(set).compute_dtype(at::kBFloat16).method(method);
          const auto ref = reference_newton_schulz(g, o, at::kDouble);
          // Two yardsticks: the formula on an ideal bf16 GEMM (fp32 sums,
          // one rounding: the same on every CPU), and on LibTorch's own
          // bf16 matmul as this CPU runs it (the same where oneDNN has a
          // bf16 kernel; summing in bf16 on AVX2).
          const double ideal = rel_err(muon::test::reference_newton_schulz_bf16_fp32_sums(g, o), ref);
          const double plain = rel_err(reference_newton_schulz(g, o, at::kBFloat16), ref);
          const double ours = rel_err(muon::newton_schulz(g.to(at::kFloat), o), ref);
          const auto what = std::string(set) + " " + muon::to_string(method) + " " +
                            std::to_string(m) + "x" + std::to_string(n) +
                            (low_rank ? " low-rank" : " log-spaced");
          std::printf("  %-40s ours %.3e  ideal-GEMM plain %.3e  LibTorch plain %.3e\n",
                      what.c_str(), ours, ideal, plain);
          EXPECT_LE(ours, ideal) << what << "; " << muon::newton_schulz_cpu_kernels(at::kBFloat16);
          EXPECT_LE(ours, plain) << what << "; " << muon::newton_schulz_cpu_kernels(at::kBFloat16);
        }
      }
    }
  }
}

TEST(NewtonSchulzPaths, FlopCounts) {
  // Plain formula: 4s²l + 2s³ per step.
  EXPECT_DOUBLE_EQ(muon::newton_schulz_plain_flops(100, 300, 5), 5 * (4.0 * 1e4 * 300 + 2e6));
  EXPECT_DOUBLE_EQ(muon::newton_schulz_plain_flops(300, 100, 5), 5 * (4.0 * 1e4 * 300 + 2e6));
  // Standard with SYRK: 3s²l + s³ per step; without: the plain count.
  auto o = NewtonSchulzOptions().method("standard");
  EXPECT_DOUBLE_EQ(muon::newton_schulz_flops(100, 300, o), 5 * (3.0 * 1e4 * 300 + 1e6));
  EXPECT_DOUBLE_EQ(muon::newton_schulz_flops(100, 300, NewtonSchulzOptions(o).symmetric(false)),
                   muon::newton_schulz_plain_flops(100, 300, 5));
  // Gram, 5 steps, phases of 3 and 2 steps (restart before step 4):
  // s²l terms 2 SYRK + 2 GEMM = 6s²l; s³ terms 5 + 7 + 3 + 5 + 3 = 23s³
  // (Gram Newton–Schulz, Zhang, Amsel, Chen, Dao 2026, a SYRK counted as
  // half a GEMM), in every dtype.
  const double s = 100, l = 400;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    EXPECT_DOUBLE_EQ(
        muon::newton_schulz_flops(100, 400, NewtonSchulzOptions().method("gram").compute_dtype(dtype)),
        6 * s * s * l + 23 * s * s * s);
  }
}

// ---------------------------------------------------------------------------
// Shapes, dtypes, views.
// ---------------------------------------------------------------------------
TEST(NewtonSchulzShapes, ZeroMatrixGivesZeros) {
  for (const auto& shape : test_shapes()) {
    for (auto method : {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram}) {
      const auto out = muon::newton_schulz(at::zeros(shape), NewtonSchulzOptions().method(method));
      EXPECT_TRUE(out.isfinite().all().item<bool>());
      EXPECT_EQ(out.abs().max().item<float>(), 0.0f);
    }
  }
  // One zero matrix inside a batch does not disturb the others.
  auto g = at::randn({3, 20, 30});
  g[1].zero_();
  const auto out = muon::newton_schulz(g);
  EXPECT_EQ(out[1].abs().max().item<float>(), 0.0f);
  EXPECT_LE(rel_err(out[2], muon::newton_schulz(g[2])), 1e-6);
}

TEST(NewtonSchulzShapes, EmptyDimensions) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{0, 5}, {5, 0}, {0, 4, 4}, {2, 0, 3}}) {
    const auto out = muon::newton_schulz(at::randn(shape));
    EXPECT_EQ(out.sizes(), at::IntArrayRef(shape));
  }
}

TEST(NewtonSchulzShapes, VectorsNormalizeToUnitLength) {
  // 1×n and n×1: A is 1×1 and the map acts on the single σ = 1/(1·s + eps)
  // ≈ 1; the output is the unit vector times p(σ).
  const auto v = at::randn({1, 37});
  auto o = NewtonSchulzOptions().coefficients("polar_express");
  const auto expected = v / v.norm() * scalar_map(1.0 / (1.0 + 1e-7), o);
  EXPECT_LE(rel_err(muon::newton_schulz(v, o), expected), 1e-5);
  EXPECT_LE(rel_err(muon::newton_schulz(v.t(), o), expected.t()), 1e-5);
}

TEST(NewtonSchulzShapes, VectorsKeepDirection) {
  // Rank one: the output is p(σ₀)·u·vᵀ, so its direction equals the
  // input's times the sign of p(σ₀) (aol maps σ = 1 to −0.585). Checked for
  // the sets whose map stays bounded (0.1 ≤ |p| ≤ 2, one sign) while σ₀
  // moves by up to 2⁻⁷ (more than a bf16 rounding), on a dense grid: cans,
  // for one, explodes just above σ = 1 and rounding decides its output. Tolerance: bf16 rounding, 2⁻⁸ per element.
  const auto v = at::randn({1, 64});
  int checked = 0;
  for (const auto& set : muon::coefficient_set_names()) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      auto o = NewtonSchulzOptions().coefficients(set).compute_dtype(dtype);
      const double sigma = 1.0 / (1.0 + 1e-7);
      const double mid = scalar_map(sigma, o);
      bool stable = true;
      for (int i = -100; i <= 100 && stable; ++i) {
        const double p = scalar_map(sigma * (1 + i / (128.0 * 100)), o);
        stable = std::abs(p) >= 0.1 && std::abs(p) <= 2.0 && (p > 0) == (mid > 0);
      }
      if (!stable) continue;
      ++checked;
      for (const auto& x : {v, v.t().contiguous()}) {
        const auto out = muon::newton_schulz(x, o);
        const double sign = mid < 0 ? -1.0 : 1.0;
        EXPECT_LE(rel_err(out / out.norm(), sign * x / x.norm()), 1e-2) << set << " " << dtype;
      }
    }
  }
  EXPECT_GE(checked, 6);  // most sets qualify; the test must not go vacuous
}

TEST(NewtonSchulzShapes, NonContiguousViewsAndDtypes) {
  at::manual_seed(5);
  const auto base = at::randn({80, 120});
  const std::vector<at::Tensor> views = {
      base.t(),                               // transposed view
      base.slice(0, 0, 80, 2),                // strided rows
      base.slice(1, 10, 110).slice(0, 5, 60),  // offset window
      base.unsqueeze(0).expand({2, 80, 120}),  // zero batch stride
  };
  for (const auto& v : views) {
    ASSERT_FALSE(v.is_contiguous());
    const auto out = muon::newton_schulz(v);
    EXPECT_LE(rel_err(out, muon::newton_schulz(v.contiguous())), 1e-6);
  }
  for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf}) {
    const auto x = base.to(dtype);
    const auto out = muon::newton_schulz(x);
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_TRUE(out.to(at::kFloat).isfinite().all().item<bool>());
  }
}

TEST(NewtonSchulzShapes, NeverAliasesOrMutatesInput) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    auto x = at::randn({30, 50}, dtype);
    const auto copy = x.clone();
    auto out = muon::newton_schulz(x, NewtonSchulzOptions().compute_dtype(dtype));
    EXPECT_TRUE(at::equal(x, copy));
    EXPECT_NE(out.data_ptr(), x.data_ptr());
    out.add_(1.0);
    EXPECT_TRUE(at::equal(x, copy));
  }
}

// ---------------------------------------------------------------------------
// Options, schedules, validation.
// ---------------------------------------------------------------------------
TEST(NewtonSchulzOptions, ScheduleSemantics) {
  auto q = NewtonSchulzOptions().coefficients("quintic").steps(7);
  auto s = q.schedule();
  ASSERT_EQ(s.size(), 7u);
  EXPECT_DOUBLE_EQ(s[5].a, 4.0848);  // cycles back to the first tuple
  EXPECT_DOUBLE_EQ(s[6].a, 3.9505);
  auto pe = NewtonSchulzOptions().coefficients("polar_express_5").steps(7).schedule();
  EXPECT_DOUBLE_EQ(pe[6].a, 2.3465413258596377);  // last repeats
  auto d = NewtonSchulzOptions().coefficients("deepseekv4");
  EXPECT_EQ(d.steps(), 10);
  EXPECT_DOUBLE_EQ(d.schedule()[7].a, 3.4445);
  EXPECT_DOUBLE_EQ(d.schedule()[8].a, 2.0);
  EXPECT_DOUBLE_EQ(d.schedule()[9].b, -1.5);
  EXPECT_EQ(NewtonSchulzOptions().coefficients("polar_express").steps(), 8);
  EXPECT_EQ(NewtonSchulzOptions().coefficients("aol").steps(), 4);
  EXPECT_DOUBLE_EQ(muon::coefficient_set("polar_express_5").safety_factor, 1.02);
  EXPECT_DOUBLE_EQ(muon::coefficient_set("polar_express").safety_factor, 1.0);
  EXPECT_EQ(muon::coefficient_set_names().size(), 9u);
}

TEST(NewtonSchulzOptions, CustomCoefficients) {
  auto o = NewtonSchulzOptions().coefficients({{3.0, -3.2, 1.2}, {2.0, -1.5, 0.5}},
                                              muon::StepSchedule::kRepeatLast);
  EXPECT_EQ(o.steps(), 2);
  o.steps(4);
  EXPECT_DOUBLE_EQ(o.schedule()[3].a, 2.0);
  const auto g = at::randn({20, 30});
  EXPECT_LE(rel_err(muon::newton_schulz(g, o),
                    reference_newton_schulz(g.to(at::kDouble), o, at::kDouble)),
            1e-4);
}

// The message of any c10::Error `f` throws ("" when none).
template <typename F>
std::string error_of(F&& f) {
  return muon::test::error_of<c10::Error>(std::forward<F>(f));
}

TEST(NewtonSchulzOptions, ValidationErrorsNameArgumentAndValue) {
  auto unknown = error_of([] { NewtonSchulzOptions().coefficients("quintik"); });
  EXPECT_NE(unknown.find("quintik"), std::string::npos);
  for (const auto& name : muon::coefficient_set_names()) {
    EXPECT_NE(unknown.find(name), std::string::npos) << "error lists " << name;
  }
  EXPECT_NE(error_of([] { NewtonSchulzOptions().steps(0); }).find("steps must be in [1, 100), got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().steps(100); }).find("got 100"), std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().eps(0.0); }).find("eps must be > 0, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().eps(-1e-7); }).find("got -1e-07"), std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().eps(NAN); }).find("eps"), std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().coefficients({{1.0, 2.0}}, muon::StepSchedule::kCycle); })
                .find("coefficients[0] must be an (a, b, c) tuple of length 3, got length 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              NewtonSchulzOptions().coefficients({{1.0, 2.0, 3.0}, {1.0, 2.0, 3.0, 4.0}});
            }).find("coefficients[1]"),
            std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().coefficients(std::vector<std::vector<double>>{}); })
                .find("must not be empty"),
            std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().compute_dtype(at::kInt); }).find("Int"),
            std::string::npos);
  EXPECT_NE(error_of([] { NewtonSchulzOptions().method("fast"); }).find("'fast'"), std::string::npos);
  EXPECT_THROW(NewtonSchulzOptions().steps(-3), c10::ValueError);
}

TEST(NewtonSchulzOptions, InputErrors) {
  EXPECT_NE(error_of([] { muon::newton_schulz(at::randn({5})); }).find("got shape [5]"),
            std::string::npos);
  EXPECT_NE(error_of([] { muon::newton_schulz(at::randn({2, 3, 4, 5})); }).find("[2, 3, 4, 5]"),
            std::string::npos);
  EXPECT_NE(error_of([] { muon::newton_schulz(at::ones({3, 3}, at::kInt)); }).find("Int"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              muon::newton_schulz(at::randn({3, 3}), NewtonSchulzOptions().compute_dtype(at::kHalf));
            }).find("Half"),
            std::string::npos);
  EXPECT_THROW(muon::newton_schulz(at::Tensor()), c10::ValueError);
}

TEST(NewtonSchulzDevices, CudaPathsMatchCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device in this build";
  at::manual_seed(9);
  const auto g = at::randn({3, 64, 160});
  for (auto method : {NewtonSchulzMethod::kStandard, NewtonSchulzMethod::kGram}) {
    auto o = NewtonSchulzOptions().method(method);
    const auto cpu = muon::newton_schulz(g, o);
    const auto gpu = muon::newton_schulz(g.cuda(), o).cpu();
    EXPECT_LE(rel_err(gpu, cpu), 1e-3);  // TF32 may be on for CUDA matmuls
  }
}

}  // namespace

TEST(NewtonSchulzFlops, CountedPerThreadPerMatrix) {
  muon::reset_newton_schulz_flops_on_this_thread();
  const muon::NewtonSchulzOptions o;
  muon::newton_schulz(at::randn({3, 16, 24}), o);
  muon::newton_schulz(at::randn({40, 8}), o);
  const double expected = 3 * muon::newton_schulz_flops(16, 24, o) + muon::newton_schulz_flops(40, 8, o);
  EXPECT_DOUBLE_EQ(muon::newton_schulz_flops_on_this_thread(), expected);
  // Another thread's calls do not count here, and it starts from zero.
  double other = -1;
  std::thread t([&] {
    other = muon::newton_schulz_flops_on_this_thread();
    muon::newton_schulz(at::randn({16, 16}), o);
  });
  t.join();
  EXPECT_EQ(other, 0.0);
  EXPECT_DOUBLE_EQ(muon::newton_schulz_flops_on_this_thread(), expected);
  muon::reset_newton_schulz_flops_on_this_thread();
  EXPECT_EQ(muon::newton_schulz_flops_on_this_thread(), 0.0);
}
