// One-pass elementwise parts of the Muon step (see fused_update.h). The
// step's elementwise work is memory-bound: as separate tensor ops it reads
// and writes each 4-byte element ~19 times (weight decay, momentum,
// Nesterov, copy, norm, scale, cast, cast back, add); these passes touch it
// 8 times, and allocate nothing.
#include "kernels/fused_update.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/symmetric.h"

namespace muon::detail {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task
constexpr int64_t kLanes = 16;       // independent fp32 partial sums
constexpr int64_t kBlock = 256;      // elements summed in fp32 before fp64

// bf16 with round-to-nearest-even (NaN stays NaN), written without branches
// so that the loops vectorize.
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

inline float from_bf16_bits(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The Nesterov update from the gradient and the updated buffer, in fp32 as
// LibTorch's lerp/add compute it: lerp(g, nb, μ) | g + μ·nb | nb.
template <bool kEma, bool kNesterov>
inline float update_of(float g, float nb, float mu, float one_minus_mu) {
  if constexpr (!kNesterov) {
    return nb;
  } else if constexpr (kEma) {
    return nb - (nb - g) * one_minus_mu;
  } else {
    return g + mu * nb;
  }
}

// The momentum rule on one element: returns the new buffer value and sets
// u (the same arithmetic as update_of, so every pass sees the same u).
template <bool kEma, bool kNesterov>
inline float momentum_of(float g, float b, float mu, float one_minus_mu, float& u) {
  const float nb = kEma ? b + one_minus_mu * (g - b)  // lerp(b, g, 1 − μ), weight < 0.5
                        : mu * b + g;
  u = update_of<kEma, kNesterov>(g, nb, mu, one_minus_mu);
  return nb;
}

// Σ u(i)² over [0, n): fp32 partial sums of kBlock elements in kLanes
// lanes (relative error ≲ 1e-6), summed in fp64, over LibTorch's threads.
// u_at(i) may have side effects (the momentum pass writes the buffer). Every
// sum of squares here goes through this one function, so a sum over the
// same values on the same threads is the same to the bit, whichever pass
// forms it.
template <typename UAt>
double sum_of_squares_of(int64_t n, const UAt& u_at) {
  auto range = [&](int64_t begin, int64_t end, double ident) {
    double total = ident;
    for (int64_t i0 = begin; i0 < end; i0 += kBlock) {
      const int64_t i1 = std::min(end, i0 + kBlock);
      float acc[kLanes] = {};
      int64_t i = i0;
      for (; i + kLanes <= i1; i += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) {
          const float u = u_at(i + l);
          acc[l] += u * u;
        }
      }
      for (; i < i1; ++i) {
        const float u = u_at(i);
        acc[0] += u * u;
      }
      double block = 0.0;
      for (const float a : acc) block += static_cast<double>(a);
      total += block;
    }
    return total;
  };
  return at::parallel_reduce(0, n, kGrain, 0.0, range, [](double x, double y) { return x + y; });
}

template <bool kEma, bool kNesterov, typename Out>
void normalized_range(Out* out, const float* buf, const float* grad, int64_t begin, int64_t end,
                      float mu, float scale) {
  const float omm = 1.0f - mu;
  for (int64_t i = begin; i < end; ++i) {
    const float v = update_of<kEma, kNesterov>(grad[i], buf[i], mu, omm) * scale;
    if constexpr (std::is_same_v<Out, uint16_t>) {
      out[i] = bf16_bits(v);
    } else {
      out[i] = v;
    }
  }
}

// Calls f(ema, nesterov) with the rule's flags as std::bool_constant.
template <typename F>
void with_rule(const MomentumRule& rule, F&& f) {
  using T = std::true_type;
  using N = std::false_type;
  if (rule.ema) {
    rule.nesterov ? f(T{}, T{}) : f(T{}, N{});
  } else {
    rule.nesterov ? f(N{}, T{}) : f(N{}, N{});
  }
}

void check_pair(const at::Tensor& a, const at::Tensor& b, int64_t matrices) {
  TORCH_INTERNAL_ASSERT(fused_eligible(a) && b.is_contiguous() && b.device().is_cpu() &&
                        a.numel() == b.numel() && matrices > 0 && a.numel() % matrices == 0);
}

}  // namespace

bool fused_eligible(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
         t.is_contiguous() && !t.is_sparse();
}

void momentum_pass(at::Tensor& buf, const at::Tensor& grad, const MomentumRule& rule,
                   int64_t matrices, double* sumsq) {
  check_pair(buf, grad, matrices);
  TORCH_INTERNAL_ASSERT(fused_eligible(grad));
  const int64_t per = buf.numel() / matrices;
  float* b = buf.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  const auto mu = static_cast<float>(rule.mu);
  const float omm = 1.0f - mu;
  for (int64_t m = 0; m < matrices; ++m) {
    float* bm = b + m * per;
    const float* gm = g + m * per;
    with_rule(rule, [&](auto ema, auto nesterov) {
      constexpr bool kEma = decltype(ema)::value;
      constexpr bool kNesterov = decltype(nesterov)::value;
      sumsq[m] = sum_of_squares_of(per, [&](int64_t i) {
        float u;
        bm[i] = momentum_of<kEma, kNesterov>(gm[i], bm[i], mu, omm, u);
        return u;
      });
    });
  }
}

void momentum_step(at::Tensor& buf, const at::Tensor& grad, const MomentumRule& rule,
                   at::Tensor* update) {
  check_pair(buf, grad, 1);
  TORCH_INTERNAL_ASSERT(fused_eligible(grad));
  float* b = buf.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* out = nullptr;
  if (rule.nesterov && update != nullptr) {
    *update = at::empty_like(buf);
    out = update->data_ptr<float>();
  }
  const auto mu = static_cast<float>(rule.mu);
  const float omm = 1.0f - mu;
  with_rule(rule, [&](auto ema, auto nesterov) {
    constexpr bool kEma = decltype(ema)::value;
    constexpr bool kNesterov = decltype(nesterov)::value;
    at::parallel_for(0, buf.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float u;
        b[i] = momentum_of<kEma, kNesterov>(g[i], b[i], mu, omm, u);
        if (kNesterov && out != nullptr) out[i] = u;
      }
    });
  });
}

double sum_of_squares(const at::Tensor& x) {
  double sumsq = 0.0;
  if (fused_eligible(x)) {
    const float* p = x.data_ptr<float>();
    sumsq = sum_of_squares_of(x.numel(), [p](int64_t i) { return p[i]; });
  } else if (!cblas_sum_of_squares(x, &sumsq)) {
    sumsq = std::numeric_limits<double>::infinity();
  }
  if (std::isfinite(sumsq)) return sumsq;
  // Squares past fp32's range (|x| ≳ 1e19), or no fast path: every element
  // converted to fp64 before it is squared.
  const double norm = at::linalg_vector_norm(x, 2, c10::nullopt, false, at::kDouble).item<double>();
  return norm * norm;
}

void normalized_update(at::Tensor& out, const at::Tensor& buf, const at::Tensor& grad,
                       const MomentumRule& rule, int64_t matrices, const double* scale) {
  check_pair(buf, grad, matrices);
  check_pair(buf, out, matrices);
  TORCH_INTERNAL_ASSERT(out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16);
  const int64_t per = buf.numel() / matrices;
  const float* b = buf.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  const auto mu = static_cast<float>(rule.mu);
  const bool bf16 = out.scalar_type() == at::kBFloat16;
  for (int64_t m = 0; m < matrices; ++m) {
    const auto s = static_cast<float>(scale[m]);
    const float* bm = b + m * per;
    const float* gm = g + m * per;
    with_rule(rule, [&](auto ema, auto nesterov) {
      constexpr bool kEma = decltype(ema)::value;
      constexpr bool kNesterov = decltype(nesterov)::value;
      at::parallel_for(0, per, kGrain, [&](int64_t begin, int64_t end) {
        if (bf16) {
          auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + m * per;
          normalized_range<kEma, kNesterov>(o, bm, gm, begin, end, mu, s);
        } else {
          normalized_range<kEma, kNesterov>(out.data_ptr<float>() + m * per, bm, gm, begin, end,
                                            mu, s);
        }
      });
    });
  }
}

void decay_and_add(at::Tensor& param, const at::Tensor& orth, double decay, double step) {
  check_pair(param, orth, 1);
  float* p = param.data_ptr<float>();
  const auto d = static_cast<float>(decay);
  const auto s = static_cast<float>(step);
  if (orth.scalar_type() == at::kBFloat16) {
    const auto* o = reinterpret_cast<const uint16_t*>(orth.data_ptr<at::BFloat16>());
    at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] = p[i] * d + s * from_bf16_bits(o[i]);
    });
    return;
  }
  TORCH_INTERNAL_ASSERT(orth.scalar_type() == at::kFloat);
  const float* o = orth.data_ptr<float>();
  at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = p[i] * d + s * o[i];
  });
}

}  // namespace muon::detail
