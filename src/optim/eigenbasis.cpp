// Eigenbases as Emerging-Optimizers' utils/eig.py computes them (eigenbasis.h).
#include "optim/eigenbasis.h"

#include <c10/util/Exception.h>

#include <tuple>

#include "util/fault_injection.h"

namespace muon::detail {

std::pair<at::Tensor, at::Tensor> eigh_descending(const at::Tensor& k) {
  fault_point("an eigenbasis's eigh");
  at::Tensor w;
  at::Tensor q;
  try {
    std::tie(w, q) = at::linalg_eigh(k);
  } catch (const c10::Error&) {
    std::tie(w, q) = at::linalg_eigh(k.to(at::kDouble));
    w = w.to(k.scalar_type());
    q = q.to(k.scalar_type());
  }
  return {w.flip({-1}).contiguous(), q.flip({-1}).contiguous()};
}

std::pair<at::Tensor, at::Tensor> orthogonal_iteration(const at::Tensor& k, const at::Tensor& q, int64_t steps) {
  fault_point("an eigenbasis's QR");
  auto out = q;
  for (int64_t i = 0; i < steps; ++i) out = std::get<0>(at::linalg_qr(at::mm(k, out)));
  // diag(Qᵀ·k·Q) (eig.py conjugate(diag=True)).
  const auto eigvals = (at::mm(out.t(), k) * out.t()).sum(1);
  const auto order = at::argsort(eigvals, /*dim=*/0, /*descending=*/true);
  return {eigvals.index_select(0, order), out.index_select(1, order).contiguous()};
}

void clip_update_rms(at::Tensor& u, double max_rms) {
  if (max_rms == 0) return;
  constexpr double kClipEps = 1e-7;
  const auto rms = u.square().mean().sqrt();
  u.mul_((max_rms / (rms + kClipEps)).clamp_max(1.0));
}

}  // namespace muon::detail
