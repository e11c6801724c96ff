// Eigenbases of symmetric positive semi-definite factors, as Emerging-
// Optimizers' utils/eig.py computes them at commit fd77292 (eigh_with_fallback,
// orthogonal_iteration), for the optimizers that precondition in an
// eigenbasis. Internal.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

namespace muon::detail {

/// The eigenvalues of the symmetric `k`, descending, and its eigenvectors
/// as columns in that order (eigh_with_fallback: torch's eigh, again in
/// fp64 when it fails; no shift is added). Q is row-major (contiguous), as
/// a checkpoint loads it, so that a resumed run multiplies it as the
/// uninterrupted one.
std::pair<at::Tensor, at::Tensor> eigh_descending(const at::Tensor& k);

/// `steps` rounds of Q ← qr(k·Q).Q from `q`, then the approximate
/// eigenvalues diag(Qᵀ·k·Q) descending and Q's columns in that order
/// (orthogonal_iteration). Q is row-major.
std::pair<at::Tensor, at::Tensor> orthogonal_iteration(const at::Tensor& k, const at::Tensor& q, int64_t steps);

/// u·min(1, max_rms / (rms(u) + 1e-7)) in place, rms(u) = √mean(u²); nothing
/// when max_rms is 0 (legacy_soap/soap.py _clip_update_rms_in_place).
void clip_update_rms(at::Tensor& u, double max_rms);

}  // namespace muon::detail
