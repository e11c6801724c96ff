// Spectral clipping through the matrix sign (muon/spectral.h).
#include "muon/spectral.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "muon/newton_schulz.h"

namespace muon {
namespace {

constexpr const char* kWho = "[muon::spectral] ";

// msign as Emerging-Optimizers computes it there: polar_express, 8 steps.
at::Tensor msign(const at::Tensor& x) {
  NewtonSchulzOptions ns;
  ns.coefficients("polar_express").steps(8).compute_dtype(x.scalar_type());
  return newton_schulz(x, ns);
}

void check_input(const at::Tensor& x, const char* fn) {
  TORCH_CHECK_VALUE(x.defined(), kWho, fn, ": x is undefined");
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, kWho, fn,
                    ": x must be a matrix (m, n) or a batch (b, m, n), got shape ", x.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(x.scalar_type()), kWho, fn,
                    ": x must have a floating dtype, got ", x.scalar_type());
}

void check_finite(double value, const char* fn, const char* name) {
  TORCH_CHECK_VALUE(std::isfinite(value), kWho, fn, ": ", name, " must be finite, got ", value);
}

// The wide orientation (rows ≤ cols) of x in its compute dtype, and whether
// it was transposed.
at::Tensor wide(const at::Tensor& x, bool& transposed) {
  transposed = x.size(-2) > x.size(-1);
  const auto work = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto w = x.to(work);
  return transposed ? w.transpose(-2, -1) : w;
}

at::Tensor restore(const at::Tensor& result, bool transposed, const at::Tensor& like) {
  return (transposed ? result.transpose(-2, -1) : result).contiguous().to(like.scalar_type());
}

at::Tensor hardcap_wide(const at::Tensor& x, double beta) {
  const auto o = msign(x);
  const auto a = beta * o - x;
  return 0.5 * (beta * o + x - at::matmul(at::matmul(a, msign(a).transpose(-2, -1)), o));
}

}  // namespace

at::Tensor spectral_clip(const at::Tensor& x, double sigma_min, double sigma_max) {
  check_input(x, "spectral_clip");
  check_finite(sigma_min, "spectral_clip", "sigma_min");
  check_finite(sigma_max, "spectral_clip", "sigma_max");
  TORCH_CHECK_VALUE(sigma_min <= sigma_max, kWho, "spectral_clip: sigma_min must be <= sigma_max, got ",
                    sigma_min, " > ", sigma_max);
  bool transposed = false;
  const auto w = wide(x, transposed);
  const auto o = msign(w);
  const auto p = at::matmul(o, w.transpose(-2, -1));  // U·Σ·Uᵀ
  const auto eye = at::eye(w.size(-2), w.options()).expand_as(p);
  auto result = (sigma_min + sigma_max) * o;
  result = result + at::matmul(msign(sigma_min * eye - p), sigma_min * o - w);
  result = result - at::matmul(msign(sigma_max * eye - p), sigma_max * o - w);
  return restore(0.5 * result, transposed, x);
}

at::Tensor spectral_hardcap(const at::Tensor& x, double beta) {
  check_input(x, "spectral_hardcap");
  check_finite(beta, "spectral_hardcap", "beta");
  TORCH_CHECK_VALUE(beta >= 0, kWho, "spectral_hardcap: beta must be >= 0, got ", beta);
  bool transposed = false;
  const auto w = wide(x, transposed);
  return restore(hardcap_wide(w, beta), transposed, x);
}

at::Tensor spectral_clipped_weight_decay(const at::Tensor& x, double beta, double c) {
  check_input(x, "spectral_clipped_weight_decay");
  check_finite(beta, "spectral_clipped_weight_decay", "beta");
  TORCH_CHECK_VALUE(beta >= 0, kWho, "spectral_clipped_weight_decay: beta must be >= 0, got ", beta);
  TORCH_CHECK_VALUE(c >= 0 && c <= 1, kWho, "spectral_clipped_weight_decay: c must be in [0, 1], got ",
                    c);
  bool transposed = false;
  const auto w = wide(x, transposed);
  return restore((1 - c) * w + c * hardcap_wide(w, beta), transposed, x);
}

}  // namespace muon
