// Dion's step on a split matrix (distributed/layouts/dion_split.h).
#include "distributed/layouts/dion_split.h"

#include <c10/util/irange.h>

namespace muon::distributed::detail {
namespace {

// This rank's block of a·bᵀ in M's orientation, a (m' × r) and b (n' × r)
// whole factors of B's orientation: B split by rows takes a's rows, by
// columns b's rows; a transposed B gives the block of (a·bᵀ)ᵀ = b·aᵀ.
at::Tensor block_outer(const at::Tensor& a, const at::Tensor& b, bool b_rows_split, bool transposed,
                       const DionSplit& s) {
  const auto an = b_rows_split ? a.narrow(0, s.offset, s.real) : a;
  const auto bn = b_rows_split ? b : b.narrow(0, s.offset, s.real);
  return transposed ? at::matmul(bn, an.t()) : at::matmul(an, bn.t());
}

}  // namespace

std::pair<at::Tensor, at::Tensor> dion_split_update(at::Tensor m, const at::Tensor& grad, const at::Tensor& q,
                                                    int64_t step, const DionOptions& o, const DionSplit& s) {
  const auto& g = s.group;
  m.add_(grad.to(m.scalar_type()));
  // B is tall: M, or Mᵀ when M is wide; M's split rows are B's rows unless B is Mᵀ.
  const bool transposed = s.rows < s.cols;
  const bool b_rows_split = transposed == s.split_cols;
  const auto b = transposed ? m.t() : m;
  const auto q_old = q.to(m.scalar_type());
  auto r = q_old;
  at::Tensor p;
  for (const auto i : c10::irange(o.power_iters())) {
    const auto seed = muon::detail::dion_sketch_seed(o, s.rows, s.cols, step, i);
    if (b_rows_split) {
      p = muon::detail::dion_orthogonalize(at::cat(g.all_gather_uneven(at::matmul(b, r).contiguous()), 0), o, seed);
      r = at::matmul(b.t(), p.narrow(0, s.offset, s.real)).contiguous();
      g.all_reduce_(r);
    } else {
      auto partial = at::matmul(b, r.narrow(0, s.offset, s.real)).contiguous();
      g.all_reduce_(partial);
      p = muon::detail::dion_orthogonalize(partial, o, seed);
      r = at::cat(g.all_gather_uneven(at::matmul(b.t(), p).contiguous()), 0);
    }
  }
  // B all zero on every rank: no update and the old Q (Dion's fix_all_zero_or_nan).
  auto nonzero = m.ne(0).any().to(at::kFloat).reshape({1});
  g.all_reduce_(nonzero);
  const auto zero = nonzero.eq(0).squeeze();
  p = p.nan_to_num() * zero.logical_not().to(p.scalar_type());
  const auto rr = r.nan_to_num() * zero.logical_not().to(r.scalar_type()) + q_old * zero.to(r.scalar_type());
  auto q_new = muon::detail::dion_next_q(r, q_old, zero, o, q.scalar_type());
  // This rank's block of the error feedback and of the update.
  m.sub_(block_outer(p, rr, b_rows_split, transposed, s), 1 - o.mu());
  auto u = block_outer(p, q_new.to(p.scalar_type()), b_rows_split, transposed, s);
  return {std::move(u), std::move(q_new)};
}

}  // namespace muon::distributed::detail
