// FLOP counts of Newton–Schulz: the plain formula, the nominal count of
// the products each method forms (a SYRK as half a GEMM), and the count the
// kernels execute (symmetric products as their blocked kernels run them),
// with Gram's fp32 state products apart.
#include <algorithm>

#include "kernels/symmetric.h"
#include "newton_schulz_internal.h"
#include "newton_schulz_iteration.h"

namespace muon {
namespace {

using detail::gram_restarts;
using detail::is_16bit_dtype;
using detail::starts_phase;

}  // namespace

double newton_schulz_plain_flops(int64_t rows, int64_t cols, int64_t steps) {
  const double s = static_cast<double>(std::min(rows, cols));
  const double l = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(steps) * (4.0 * s * s * l + 2.0 * s * s * s);
}

namespace {

// The products of a Newton–Schulz call whose cost depends on the kernels.
enum class Product {
  kGramOfX,       // X·Xᵀ (or XᵀX): symmetric, s×s from s×l
  kSquare,        // A·A: symmetric, s×s
  kStateProduct,  // Gram's Q·Z, R·Z, Z·RZ: commuting, symmetric results
};

// FLOPs of one call on one m×n matrix; `cost(kind, full)` gives what a
// product of that kind costs whose full GEMM costs `full`.
template <typename Cost>
double schedule_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options, Cost cost) {
  const double s = static_cast<double>(std::min(rows, cols));
  const double l = static_cast<double>(std::max(rows, cols));
  const double gram_of_x = cost(Product::kGramOfX, 2.0 * s * s * l);
  const double square = cost(Product::kSquare, 2.0 * s * s * s);
  const double state = cost(Product::kStateProduct, 2.0 * s * s * s);
  const auto schedule = options.schedule();
  const auto n = static_cast<int64_t>(schedule.size());
  if (resolve_method(rows, cols, options) == NewtonSchulzMethod::kStandard) {
    double f = 0;
    for (const auto& k : schedule) f += gram_of_x + 2.0 * s * s * l + (k.c != 0.0 ? square : 0.0);
    return f;
  }
  const auto restarts = gram_restarts(n);
  double f = gram_of_x;  // R₀
  bool fresh = true;
  for (int64_t k = 0; k < n; ++k) {
    if (starts_phase(restarts, k)) {
      f += 2.0 * s * s * l + gram_of_x;  // Q·X, new R
      fresh = true;
    }
    if (schedule[static_cast<size_t>(k)].c != 0.0) f += square;
    if (!fresh) f += state;  // Q·Z
    fresh = false;
    if (k + 1 < n && !starts_phase(restarts, k + 1)) f += 2.0 * state;  // R·Z, Z·RZ
  }
  return f + 2.0 * s * s * l;  // final Q·X
}

}  // namespace

double newton_schulz_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options) {
  const double half = options.symmetric() ? 0.5 : 1.0;  // a SYRK is half a GEMM
  return schedule_flops(rows, cols, options, [&](Product kind, double full) {
    return kind == Product::kStateProduct ? full : half * full;
  });
}

namespace {

// newton_schulz_executed_flops, with Gram's s×s state products left out
// unless `states`.
double executed_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                      bool states) {
  if (!options.symmetric()) {
    return schedule_flops(rows, cols, options, [&](Product kind, double full) {
      return states || kind == Product::kGramOfX ? full : 0.0;
    });
  }
  const int64_t s = std::min(rows, cols);
  const auto compute = options.compute_dtype();
  // 16-bit Gram keeps its s×s state in fp32; the standard method forms A²
  // in the compute dtype.
  const bool gram = resolve_method(rows, cols, options) == NewtonSchulzMethod::kGram;
  const auto state_dtype = gram && is_16bit_dtype(compute) ? at::kFloat : compute;
  const double x_share = detail::symmetric_product_fraction(s, compute, true);
  const double square_share = detail::symmetric_product_fraction(s, state_dtype, true);
  const double state_share = detail::symmetric_product_fraction(s, state_dtype, false);
  return schedule_flops(rows, cols, options, [&](Product kind, double full) {
    switch (kind) {
      case Product::kGramOfX:
        return x_share * full;
      case Product::kSquare:
        return states ? square_share * full : 0.0;
      case Product::kStateProduct:
        break;
    }
    return states ? state_share * full : 0.0;
  });
}

}  // namespace

double newton_schulz_executed_flops(int64_t rows, int64_t cols,
                                    const NewtonSchulzOptions& options) {
  return executed_flops(rows, cols, options, true);
}

namespace detail {

double executed_fp32_state_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options) {
  if (!is_16bit_dtype(options.compute_dtype()) ||
      resolve_method(rows, cols, options) != NewtonSchulzMethod::kGram) {
    return 0.0;
  }
  return executed_flops(rows, cols, options, true) - executed_flops(rows, cols, options, false);
}

}  // namespace detail

}  // namespace muon
