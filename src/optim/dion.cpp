// Dion: options, the whole-matrix step, save/load and the registry entry.
#include "muon/optim/dion.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <tuple>
#include <utility>

#include "builtin_entries.h"
#include "builtin_states.h"
#include "muon/compat.h"
#include "optim/closure.h"
#include "optim/elementwise_optimizer.h"
#include "optim/instantiate.h"
#include "optim/step_transaction.h"
#include "optim/whole_matrix_optimizer.h"
#include "option_fields.h"
#include "util/fault_injection.h"
#include "util/names.h"
#include "util/scale.h"
#include "util/seed.h"

namespace muon {

MUON_INSTANTIATE_LISTED(WholeMatrixOptimizer, Dion, DionOptions, DionParamState);

namespace {

constexpr const char* kWho = "[muon::Dion] ";

// The seed of a draw for a rows × cols matrix: the options' seed, the shape and `draw`.
uint64_t draw_seed(const DionOptions& o, int64_t rows, int64_t cols, uint64_t draw) {
  return detail::shape_draw_seed(o.seed(), rows, cols, draw);
}

// N(0, 1) entries of `sizes`, fp32 on the CPU, from the generator seeded by `seed`.
at::Tensor cpu_randn(at::IntArrayRef sizes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

// The dtype orth(P) and the column norms compute in: fp32, fp64 for fp64.
at::ScalarType wide(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

}  // namespace

namespace detail {

int64_t dion_rank(int64_t rows, int64_t cols, const DionOptions& o) {
  const auto small = std::min(rows, cols);
  const auto multiple = o.rank_multiple_of();
  const auto want = std::ceil(o.rank_fraction() * static_cast<double>(small) / static_cast<double>(multiple));
  return std::min(multiple * static_cast<int64_t>(want), small);
}

at::Tensor dion_initial_q(int64_t rows, int64_t cols, const DionOptions& o, const at::TensorOptions& options) {
  const auto r = dion_rank(rows, cols, o);
  return cpu_randn({std::min(rows, cols), r}, draw_seed(o, rows, cols, 0)).to(options);
}

uint64_t dion_sketch_seed(const DionOptions& o, int64_t rows, int64_t cols, int64_t step, int64_t iteration) {
  return draw_seed(o, rows, cols,
                   1 + static_cast<uint64_t>(step) * kDionMaxPowerIters + static_cast<uint64_t>(iteration));
}

at::Tensor dion_next_q(const at::Tensor& r, const at::Tensor& q_old, const at::Tensor& zero, const DionOptions& o,
                       at::ScalarType dtype) {
  const auto rr = r.nan_to_num() * zero.logical_not().to(r.scalar_type()) + q_old * zero.to(r.scalar_type());
  const auto rw = rr.to(wide(rr.scalar_type()));
  return (rw / (at::linalg_vector_norm(rw, 2, {0}, /*keepdim=*/true) + o.epsilon())).to(dtype);
}

at::Tensor dion_orthogonalize(const at::Tensor& p, const DionOptions& o, uint64_t draw) {
  fault_point("Dion's orthogonalization");
  const auto dtype = wide(p.scalar_type());
  const auto pw = p.to(dtype);
  const int64_t rows = p.size(0);
  const int64_t r = p.size(1);
  if (rows <= r || o.qr_method() == "qr") return std::get<0>(at::linalg_qr(pw)).to(p.scalar_type());
  // Randomized Cholesky QR (Dion's orthogonalize): a sketch's R, then one Cholesky QR pass.
  const auto k = 128 * static_cast<int64_t>(std::ceil(o.rcqr_oversample() * static_cast<double>(r) / 128.0));
  const auto s = cpu_randn({k, rows}, draw).mul_(std::sqrt(1.0 / static_cast<double>(k))).to(pw.options());
  const auto r1 = std::get<1>(at::linalg_qr(at::matmul(s, pw), "r"));
  auto q = at::linalg_solve_triangular(r1, pw, /*upper=*/true, /*left=*/false);
  const auto r2 = std::get<0>(at::linalg_cholesky_ex(at::matmul(q.t(), q), /*upper=*/true));
  q = at::linalg_solve_triangular(r2, q, /*upper=*/true, /*left=*/false);
  return q.to(p.scalar_type());
}

at::Tensor dion_matrix_update(const at::Tensor& grad, DionParamState& st, const DionOptions& o) {
  const int64_t rows = grad.size(0);
  const int64_t cols = grad.size(1);
  if (!st.Q().defined()) st.Q(dion_initial_q(rows, cols, o, grad.options()));
  st.step(st.step() + 1);
  auto m = st.momentum().view({rows, cols});
  m.add_(grad.to(m.scalar_type()));
  // B is tall: M, or Mᵀ when M is wide.
  const bool transposed = rows < cols;
  const auto b = transposed ? m.t() : m;
  const auto q_old = st.Q().to(m.scalar_type());
  auto q = q_old;
  at::Tensor p;
  for (const auto i : c10::irange(o.power_iters())) {
    p = dion_orthogonalize(at::matmul(b, q), o, dion_sketch_seed(o, rows, cols, st.step(), i));
    q = at::matmul(b.t(), p);
  }
  // All-zero B: no update and the old Q; otherwise NaNs become 0 (Dion's fix_all_zero_or_nan).
  const auto zero = b.eq(0).all();
  p = p.nan_to_num() * zero.logical_not().to(p.scalar_type());
  const auto r = q.nan_to_num() * zero.logical_not().to(q.scalar_type()) + q_old * zero.to(q.scalar_type());
  // Error feedback, then Q ← R with unit columns.
  const auto pr = at::matmul(p, r.t());
  m.sub_(transposed ? pr.t() : pr, 1 - o.mu());
  st.Q(dion_next_q(r, q_old, zero, o, st.Q().scalar_type()));
  const auto u = at::matmul(p, st.Q().to(p.scalar_type()).t());
  return transposed ? u.t().contiguous() : u;
}

}  // namespace detail

// ---- DionOptions ---------------------------------------------------------------

void DionOptions::validate() const { detail::check_listed_fields(*this, kWho); }

// ---- Dion ----------------------------------------------------------------------

std::vector<int64_t> Dion::q_shape(const at::Tensor& param) const {
  const auto [rows, cols] = whole_matrix_dims(param);
  for (const auto& group : param_groups()) {
    for (const auto& p : group.params()) {
      if (p.is_same(param)) {
        return {std::min(rows, cols), detail::dion_rank(rows, cols, static_cast<const DionOptions&>(group.options()))};
      }
    }
  }
  TORCH_CHECK_VALUE(false, kWho, "q_shape: the parameter is not one of this optimizer's");
}

void Dion::step_matrices(const MatrixUpdate& update) {
  detail::step_each_parameter<DionParamState, DionOptions>(
      *this, kWho,
      [&](const at::Tensor& p, DionParamState& st, const DionOptions& o) {
        if (!st.momentum().defined()) st.momentum(at::zeros_like(p, at::MemoryFormat::Contiguous));
        const auto [rows, cols] = whole_matrix_dims(p);
        return update(p, st, o, rows, cols);
      },
      [this](at::Tensor& p, const at::Tensor& u, const DionOptions& o) {
        const auto [rows, cols] = whole_matrix_dims(p);
        muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
        p.add_(u.view(p.sizes()), -o.lr() * std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)));
      });
}

void Dion::step_parameters() {
  step_matrices([](const at::Tensor& p, DionParamState& st, const DionOptions& o, int64_t rows, int64_t cols) {
    return detail::dion_matrix_update(p.grad().reshape({rows, cols}), st, o);
  });
}

// Dion's entry (muon::Dion): defaults are Dion's, lr and weight_decay aside
// (the common fields). Dion steps matrices: 1-D, embedding and head
// parameters go to scalar_optimizer (Dion's "adamw" / "lion" groups).
void detail::register_dion(OptimizerRegistry& registry) {
  auto e = detail::matrix_entry<Dion, DionOptions>(
      "dion", detail::dion_state(),
      "Dion (muon::Dion): low-rank orthonormal updates by power iteration with QR and error feedback",
      detail::listed_option_fields<DionOptions>());
  registry.add(detail::hookable<DionOptions>(std::move(e), "decoupled"));
}

}  // namespace muon
