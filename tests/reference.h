#pragma once
// Plain references the tests compare the library against, written with plain
// tensor ops and independently of the library's kernels.
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <vector>

#include "muon/newton_schulz.h"

namespace muon::test {

/// The coefficients (a, b, c) of one Newton–Schulz step.
using NsTuple = std::array<double, 3>;
/// A list of step tuples; `reference_newton_schulz` cycles through it.
using NsTuples = std::vector<NsTuple>;

/// Jiacheng You's quintic schedule, five tuples cycled (Megatron-Core's
/// default for Muon).
inline const NsTuples kQuintic = {{4.0848, -6.8946, 2.9270},
                                  {3.9505, -6.3029, 2.6377},
                                  {3.7418, -5.5913, 2.3037},
                                  {2.8769, -3.1427, 1.2046},
                                  {2.8366, -3.0525, 1.2012}};
/// Keller Jordan's single quintic tuple ("Muon: An optimizer for hidden
/// layers in neural networks", 2024), repeated every step.
inline const NsTuples kSimple = {{3.4445, -4.7750, 2.0315}};

/// Newton–Schulz by the textbook formula: on the short side (a tall matrix is
/// transposed), X₀ = G / (‖G‖_F·safety + eps), then for step k with
/// (a, b, c) = tuples[k mod size]: A = XXᵀ, B = bA + cA², X ← aX + BX.
/// Every op runs in `dtype` (fp64 by default: the reference the library's
/// error is measured against); a 3-D input is a batch of matrices.
inline at::Tensor reference_newton_schulz(const at::Tensor& g, const NsTuples& tuples,
                                          int64_t steps, double eps = 1e-7,
                                          double safety = 1.0,
                                          at::ScalarType dtype = at::kDouble) {
  if (g.dim() == 3) {
    std::vector<at::Tensor> outs;
    for (int64_t i = 0; i < g.size(0); ++i) {
      outs.push_back(reference_newton_schulz(g[i], tuples, steps, eps, safety, dtype));
    }
    return at::stack(outs);
  }
  auto x = g.to(dtype);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = x / (x.norm() * safety + eps);
  for (int64_t k = 0; k < steps; ++k) {
    const auto& abc = tuples[static_cast<size_t>(k) % tuples.size()];
    const auto a = at::mm(x, x.t());
    const auto b = abc[1] * a + abc[2] * at::mm(a, a);
    x = abc[0] * x + at::mm(b, x);
  }
  return tall ? x.t() : x;
}

/// The textbook formula in bf16 on an ideal bf16 GEMM, whatever the CPU:
/// every product sums the exact products of its bf16 operands in fp32 and
/// rounds once (the operands widened to fp32, an fp64 product would do as
/// well), the element-wise terms b·A, c·A², a·X and the sums rounded as
/// LibTorch rounds bf16 element-wise ops. What LibTorch's bf16 matmul
/// computes where oneDNN has a bf16 kernel; on other CPUs (AVX2)
/// LibTorch 1.13 sums some layouts in bf16 and is far less accurate, so
/// this is the yardstick that means the same on every CPU.
inline at::Tensor reference_newton_schulz_bf16_fp32_sums(const at::Tensor& g,
                                                         const NewtonSchulzOptions& options) {
  if (g.dim() == 3) {
    std::vector<at::Tensor> outs;
    for (int64_t i = 0; i < g.size(0); ++i) {
      outs.push_back(reference_newton_schulz_bf16_fp32_sums(g[i], options));
    }
    return at::stack(outs);
  }
  auto mm = [](const at::Tensor& x, const at::Tensor& y) {
    return at::mm(x.to(at::kFloat), y.to(at::kFloat)).to(at::kBFloat16);
  };
  auto x = g.to(at::kFloat);
  const bool tall = x.size(0) > x.size(1);
  if (tall) x = x.t();
  x = (x / (x.norm() * options.coefficients().safety_factor + options.eps())).to(at::kBFloat16);
  for (const auto& k : options.schedule()) {
    const auto a = mm(x, x.t());
    const auto b = k.b * a + k.c * mm(a, a);
    x = k.a * x + mm(b, x);
  }
  return tall ? x.t() : x;
}

/// The same formula with the step schedule, eps and safety factor of
/// `options` (its coefficient tables taken as given), in `dtype`.
inline at::Tensor reference_newton_schulz(const at::Tensor& g, const NewtonSchulzOptions& options,
                                          at::ScalarType dtype = at::kDouble) {
  NsTuples tuples;
  for (const auto& k : options.schedule()) tuples.push_back({k.a, k.b, k.c});
  return reference_newton_schulz(g, tuples, static_cast<int64_t>(tuples.size()), options.eps(),
                                 options.coefficients().safety_factor, dtype);
}

}  // namespace muon::test
