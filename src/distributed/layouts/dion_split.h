// Dion's step on a matrix split across a group, the low-rank factors
// exchanged: shared by the sharded layout (ShardedDion, rows split) and the
// tensor-parallel one (TensorParallelDion, rows or columns split).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

#include "muon/distributed/runtime/group.h"
#include "muon/optim/dion.h"

namespace muon::distributed::detail {

/// One matrix M (rows × cols) split over `group`: this rank holds `real`
/// consecutive rows (or columns, `split_cols`) of it from `offset`.
struct DionSplit {
  Group group;
  int64_t rows = 0, cols = 0;
  bool split_cols = false;
  int64_t offset = 0, real = 0;
};

/// Dion's steps 1–5 (muon/optim/dion.h) at step `step` on this rank's block
/// `m` of the momentum (real × cols, or rows × real for `split_cols`, a view
/// updated in place: the gradient block `grad` added, the error feedback
/// taken), with `q` the whole Q before the step, alike on every rank.
/// Returns this rank's block of the update P·Qᵀ (m's shape) and the new Q,
/// whole and alike on every rank. B (M, or Mᵀ when M is wide) is split by
/// its rows or by its columns:
///   - by rows: every rank forms its rows of B·Q, the rows are all-gathered
///     and P orthonormalized whole on every rank; R = Bᵀ·P is the all-reduced
///     sum of each rank's Bᵢᵀ·Pᵢ;
///   - by columns: P = Σ Bᵢ·Qᵢ is all-reduced, orthonormalized on every rank;
///     R = Bᵀ·P is each rank's rows, all-gathered.
/// Per power iteration each rank sends about (m' + n')·r elements (m' × n'
/// is B's shape), and the zero check one. Collective over the group.
std::pair<at::Tensor, at::Tensor> dion_split_update(at::Tensor m, const at::Tensor& grad, const at::Tensor& q,
                                                    int64_t step, const DionOptions& o, const DionSplit& s);

}  // namespace muon::distributed::detail
