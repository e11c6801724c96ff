// bf16 Newton–Schulz against the bf16 step of NVIDIA's Emerging-Optimizers
// (EO), written here with plain at:: ops, both measured against the same
// schedule evaluated in fp64 (reference.h).
#include <gtest/gtest.h>

#include <muon/newton_schulz.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cpu_product_util.h"
#include "kernels/symmetric.h"
#include "reference.h"

namespace {

using muon::NewtonSchulzMethod;
using muon::NewtonSchulzOptions;
using muon::test::reference_newton_schulz;

double rel_err(const at::Tensor& y, const at::Tensor& ref) {
  return (y.to(at::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
}

// EO's bf16 iteration on the short side: X in bf16, then per step
// A = X·Xᵀ, B = b·A + c·A·A, X = a·X + B·X, each a bf16 GEMM (LibTorch's CPU
// bf16 products sum in fp32 and round once, a·X and b·A included). The
// input is normalized as muon::newton_schulz does (in fp32, rounded once),
// so that the two differ only in their iterations.
at::Tensor eo_bf16(const at::Tensor& g32, const NewtonSchulzOptions& o) {
  const bool tall = g32.size(0) > g32.size(1);
  auto x = tall ? g32.t() : g32;
  const double norm = x.to(at::kDouble).norm().item<double>();
  x = (x / (norm * o.coefficients().safety_factor + o.eps())).to(at::kBFloat16);
  for (const auto& k : o.schedule()) {
    const auto a = at::mm(x, x.t());
    const auto b = at::addmm(a, a, a, k.b, k.c);
    x = at::addmm(x, b, x, k.a, 1.0);
  }
  return tall ? x.t() : x;
}

// Our bf16 standard iteration rounds what EO rounds (A, the s×s step
// matrix, X after each step) except the diagonal of the step matrix: EO
// rounds B_ii (as large as a, the slope that carries small singular
// directions), ours B_ii minus their mean (α = a + mean B_ii is applied
// exactly as α·X inside the GEMM). Its expected squared error is therefore
// smaller by that rounding's share. What is compared is a realization:
// ‖error‖² summed over k seeds, each a sum over s singular directions of
// contributions of similar size, so it fluctuates around its expectation by
// about 1/√(k·s) relative; the bound allows two such deviations, 2/√(k·s)
// (at most 9% here; the code before the one-A, exact-diagonal step was
// 1.2–1.4× EO's error on these inputs).
//
// The polar_express (paper's 8-step) set only on aspect ≥ 3: on square
// Gaussian matrices the smallest singular values lie below bf16's
// resolution of X, and its steep first steps (slope 8.2) map rounding noise
// there to O(1) output differences that change from seed to seed for any
// bf16 evaluation, EO's included. At aspect 3, σ_min/σ_max stays near
// (1 − 1/√3)/(1 + 1/√3) ≈ 0.27 (Marchenko–Pastur).
TEST(NewtonSchulzBf16, AtLeastAsAccurateAsEmergingOptimizers) {
  constexpr int kSeeds = 4;
  struct Case {
    std::string set;
    std::vector<std::pair<int64_t, int64_t>> shapes;
  };
  const std::vector<Case> cases = {
      {"quintic", {{128, 128}, {256, 256}, {384, 384}, {256, 768}, {768, 256}}},
      {"simple", {{256, 256}, {192, 576}}},
      {"polar_express", {{256, 768}, {768, 256}, {128, 512}}},
  };
  for (const auto& c : cases) {
    auto o = NewtonSchulzOptions()
                 .coefficients(c.set)
                 .compute_dtype(at::kBFloat16)
                 .method(NewtonSchulzMethod::kStandard);
    for (const auto& [m, n] : c.shapes) {
      double ours_sq = 0;
      double eo_sq = 0;
      for (int seed = 0; seed < kSeeds; ++seed) {
        at::manual_seed(1000 * seed + m + n);
        const auto g = at::randn({m, n}, at::kDouble);
        const auto ref = reference_newton_schulz(g, o);
        const auto g32 = g.to(at::kFloat);
        const double ours = rel_err(muon::newton_schulz(g32, o), ref);
        const double eo = rel_err(eo_bf16(g32, o), ref);
        ours_sq += ours * ours;
        eo_sq += eo * eo;
      }
      const double s = static_cast<double>(std::min(m, n));
      const double margin = 2.0 / std::sqrt(kSeeds * s);
      EXPECT_LE(std::sqrt(ours_sq), std::sqrt(eo_sq) * (1 + margin))
          << c.set << " " << m << "x" << n << ": ours " << std::sqrt(ours_sq / kSeeds)
          << ", EO " << std::sqrt(eo_sq / kSeeds) << " (rms over seeds)";
    }
  }
}

TEST(NewtonSchulzBf16, BatchedMatricesEachGetTheirOwnStep) {
  // Each matrix's step matrix is shifted by the mean of its own diagonal
  // (matrices of very different conditioning in one batch): the batch must
  // equal the matrices run one at a time, to the bit (the same kernels).
  // A batch of Gaussian matrices shares one α and runs as one batch; the
  // rank-4 matrix needs another.
  at::manual_seed(3);
  auto mixed = at::randn({3, 96, 160});
  mixed[1] = at::mm(at::randn({96, 4}), at::randn({4, 160}));  // rank 4
  mixed[2].mul_(1e-3);
  for (const auto& g : {mixed, at::randn({4, 96, 160})}) {
  for (const char* set : {"quintic", "cubic"}) {
    auto o = NewtonSchulzOptions()
                 .coefficients(set)
                 .compute_dtype(at::kBFloat16)
                 .method(NewtonSchulzMethod::kStandard);
    const auto tall = g.transpose(1, 2).contiguous();
    const auto batched = muon::newton_schulz(g, o);
    const auto batched_tall = muon::newton_schulz(tall, o);
    for (int64_t i = 0; i < g.size(0); ++i) {
      EXPECT_TRUE(at::equal(batched[i], muon::newton_schulz(g[i], o))) << set << " matrix " << i;
      EXPECT_TRUE(at::equal(batched_tall[i], muon::newton_schulz(tall[i], o)))
          << set << " tall matrix " << i;
    }
  }
  }
}

TEST(NewtonSchulzBf16, DnnlAccumulatesIntoBf16ResultWithOneRounding) {
  // The step's GEMM: out = β·out + α·A·B with bf16 out, inputs and C = out's
  // own values, summed in fp32 and rounded once (β·C is not rounded first).
  if (!muon::detail::dnnl_matmul_available()) GTEST_SKIP() << "built without oneDNN";
  at::manual_seed(6);
  const int64_t k = 96;
  const auto a = at::randn({40, k}).to(at::kBFloat16);
  const auto b = at::randn({k, 24}).to(at::kBFloat16);
  auto out = at::randn({40, 24}).to(at::kBFloat16);
  const auto c = out.to(at::kDouble);
  const double beta = 4.0848;  // not a bf16 value: β·C rounded first would show
  muon::test::cpu_product(out, a, b, 1.0, beta);
  const auto exact = beta * c + at::mm(a.to(at::kDouble), b.to(at::kDouble));
  // One bf16 rounding (unit roundoff 2⁻⁸) plus fp32 summation of k exact
  // products (k·2⁻²⁴ relative to their magnitudes, far below it).
  const auto bound = std::ldexp(1.0, -8) * exact.abs() +
                     k * std::ldexp(1.0, -24) * (beta * c.abs() + at::mm(a.to(at::kDouble).abs(),
                                                                       b.to(at::kDouble).abs()));
  EXPECT_TRUE(((out.to(at::kDouble) - exact).abs() <= bound).all().item<bool>());
  // ...and equals the rounding of the fp32 sum wherever that is not a tie.
  const auto once = exact.to(at::kBFloat16).to(at::kDouble);
  EXPECT_GE((out.to(at::kDouble) == once).to(at::kDouble).mean().item<double>(), 0.99);
}

}  // namespace
