// Newton–Schulz orthogonalization: standard and Gram evaluations of one
// polynomial schedule.
#include "muon/newton_schulz.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/symmetric.h"

namespace muon {
namespace {

using detail::batched_addmm;
using detail::batched_mm_out;
using detail::syrk;

// The s×s polynomial of one step, with the identity term folded in:
// P = a·I + b·A + c·A² (A symmetric), so that X ← P·X is a single GEMM.
void step_polynomial(at::Tensor& p, const at::Tensor& a_mat, const NsCoefficients& k,
                     double identity, bool symmetric) {
  if (a_mat.scalar_type() == at::kBFloat16 || a_mat.scalar_type() == at::kHalf) {
    // a + b·A + c·A² cancels heavily (polar_express step 1 near σ = 1:
    // 8.2 − 21.6 + 14.6 ≈ 1.2); formed in 16-bit it loses most digits.
    // P is s×s, so form it in fp32 and round once.
    const auto a32 = a_mat.to(at::kFloat);
    auto p32 = at::empty_like(a32);
    step_polynomial(p32, a32, k, identity, symmetric);
    p.copy_(p32);
    return;
  }
  if (k.c != 0.0) {
    p.copy_(a_mat);
    syrk(p, a_mat, /*trans=*/false, k.c, k.b, symmetric);
  } else {
    at::mul_out(p, a_mat, k.b);
  }
  if (identity != 0.0) p.diagonal(0, 1, 2).add_(identity);
}

// X ← P·X (wide) or X·P (tall); P symmetric.
void apply_left_or_right(at::Tensor& out, const at::Tensor& p, const at::Tensor& x, bool tall) {
  if (tall) {
    batched_mm_out(out, x, p);
  } else {
    batched_mm_out(out, p, x);
  }
}

at::Tensor standard_iteration(at::Tensor x, const std::vector<NsCoefficients>& schedule,
                              bool tall, bool symmetric) {
  const int64_t s = tall ? x.size(2) : x.size(1);
  auto gram = at::empty({x.size(0), s, s}, x.options());
  auto poly = at::empty_like(gram);
  auto next = at::empty_like(x);
  for (const auto& k : schedule) {
    syrk(gram, x, tall, 1.0, 0.0, symmetric);
    step_polynomial(poly, gram, k, k.a, symmetric);
    apply_left_or_right(next, poly, x, tall);
    std::swap(x, next);
  }
  return x;
}

// Phase lengths for Gram Newton–Schulz: the final phase has at most two
// steps (its accumulated error is what reaches the output), earlier phases
// at most three, balanced. Returns the 0-based steps that start a new phase.
std::vector<int64_t> gram_restarts(int64_t steps) {
  std::vector<int64_t> starts;
  if (steps <= 2) return starts;
  const int64_t head = steps - 2;            // steps before the final phase
  const int64_t phases = (head + 2) / 3;     // ceil(head / 3)
  int64_t at = 0;
  for (int64_t p = 0; p < phases; ++p) {
    at += head / phases + (p < head % phases ? 1 : 0);
    starts.push_back(at);
  }
  return starts;  // the last entry is steps - 2, the start of the final phase
}

// Gram Newton–Schulz (Zhang, Amsel, Chen, Dao 2026). With X_k = M_k⋯M_1·X₀
// and M = a·I + b·R + c·R², R = X Xᵀ: Z = bR + cR², Q ← Q·Z + a·Q,
// R ← (Z + aI)·(R·Z + a·R). All s×s matrices are polynomials in R₀, so the
// output is Qᵀ·X₀ (wide) or X₀·Q (tall).
at::Tensor gram_iteration(at::Tensor x, const std::vector<NsCoefficients>& schedule, bool tall,
                          bool symmetric) {
  const int64_t s = tall ? x.size(2) : x.size(1);
  const auto n = static_cast<int64_t>(schedule.size());
  const auto restarts = gram_restarts(n);
  auto r = at::empty({x.size(0), s, s}, x.options());
  auto z = at::empty_like(r);
  auto next = at::empty_like(x);
  at::Tensor q;  // undefined at the start of a phase: Q = I

  auto apply_q = [&](at::Tensor& out, const at::Tensor& in) {
    apply_left_or_right(out, tall ? q : q.transpose(1, 2), in, tall);
  };
  syrk(r, x, tall, 1.0, 0.0, symmetric);
  for (int64_t k = 0; k < n; ++k) {
    if (std::find(restarts.begin(), restarts.end(), k) != restarts.end()) {
      apply_q(next, x);
      std::swap(x, next);
      syrk(r, x, tall, 1.0, 0.0, symmetric);
      q = at::Tensor();
    }
    const auto& c = schedule[static_cast<size_t>(k)];
    step_polynomial(z, r, c, 0.0, symmetric);
    if (!q.defined()) {
      q = z.clone();
      q.diagonal(0, 1, 2).add_(c.a);
    } else {
      q = batched_addmm(q, q, z, c.a, 1.0);
    }
    const bool phase_ends =
        k + 1 == n || std::find(restarts.begin(), restarts.end(), k + 1) != restarts.end();
    if (!phase_ends) {
      auto rz = batched_addmm(r, r, z, c.a, 1.0);
      r = batched_addmm(rz, z, rz, c.a, 1.0);
    }
  }
  apply_q(next, x);
  return next;
}

void check_input(const at::Tensor& x, const NewtonSchulzOptions& options) {
  TORCH_CHECK_VALUE(x.defined(), "[muon::newton_schulz] x is an undefined tensor");
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3,
                    "[muon::newton_schulz] x must be 2-D (m×n) or 3-D (b×m×n), got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(x.scalar_type()),
                    "[muon::newton_schulz] x must have a floating dtype, got ", x.scalar_type());
  TORCH_CHECK_VALUE(!(options.compute_dtype() == at::kHalf && x.device().is_cpu()),
                    "[muon::newton_schulz] compute_dtype Half is not supported on CPU; use "
                    "BFloat16 or Float");
}

}  // namespace

NewtonSchulzMethod resolve_method(int64_t rows, int64_t cols, const NewtonSchulzOptions& options) {
  if (options.method() != NewtonSchulzMethod::kAuto) return options.method();
  const double s = static_cast<double>(std::min(rows, cols));
  const double l = static_cast<double>(std::max(rows, cols));
  const bool wide = s >= 1 && l / s >= kGramMinAspect;
  if (wide && options.steps() >= kGramMinSteps) return NewtonSchulzMethod::kGram;
  return NewtonSchulzMethod::kStandard;
}

double newton_schulz_plain_flops(int64_t rows, int64_t cols, int64_t steps) {
  const double s = static_cast<double>(std::min(rows, cols));
  const double l = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(steps) * (4.0 * s * s * l + 2.0 * s * s * s);
}

double newton_schulz_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options) {
  const double s = static_cast<double>(std::min(rows, cols));
  const double l = static_cast<double>(std::max(rows, cols));
  const double sym = options.symmetric() ? 1.0 : 2.0;  // a SYRK is half a GEMM
  const auto schedule = options.schedule();
  const auto n = static_cast<int64_t>(schedule.size());
  if (resolve_method(rows, cols, options) == NewtonSchulzMethod::kStandard) {
    double f = 0;
    for (const auto& k : schedule) {
      f += sym * s * s * l + 2.0 * s * s * l + (k.c != 0.0 ? sym * s * s * s : 0.0);
    }
    return f;
  }
  const auto restarts = gram_restarts(n);
  double f = sym * s * s * l;  // R₀
  bool fresh = true;
  for (int64_t k = 0; k < n; ++k) {
    if (std::find(restarts.begin(), restarts.end(), k) != restarts.end()) {
      f += 2.0 * s * s * l + sym * s * s * l;
      fresh = true;
    }
    if (schedule[static_cast<size_t>(k)].c != 0.0) f += sym * s * s * s;
    if (!fresh) f += 2.0 * s * s * s;  // Q·Z
    fresh = false;
    const bool phase_ends =
        k + 1 == n || std::find(restarts.begin(), restarts.end(), k + 1) != restarts.end();
    if (!phase_ends) f += 4.0 * s * s * s;  // R·Z and Z·RZ
  }
  return f + 2.0 * s * s * l;  // final Q·X
}

at::Tensor newton_schulz(const at::Tensor& x, const NewtonSchulzOptions& options) {
  options.validate();
  check_input(x, options);
  if (x.numel() == 0) return at::zeros_like(x, at::MemoryFormat::Contiguous);

  const bool batched = x.dim() == 3;
  const auto x3 = batched ? x : x.unsqueeze(0);
  const int64_t rows = x3.size(1);
  const int64_t cols = x3.size(2);
  const bool tall = rows > cols;
  const auto compute = options.compute_dtype();

  // Normalize each matrix in fp32 (fp64 for fp64 compute), then round once
  // to the compute dtype. `copy=true`: the result never aliases x.
  const auto norm_dtype = compute == at::kDouble ? at::kDouble : at::kFloat;
  auto work = x3.to(norm_dtype, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous);
  auto norms = at::linalg_vector_norm(work, 2, at::IntArrayRef{1, 2}, /*keepdim=*/true);
  norms.mul_(options.coefficients().safety_factor).add_(options.eps());
  work.div_(norms);
  if (compute != norm_dtype) work = work.to(compute);

  const auto schedule = options.schedule();
  const auto method = resolve_method(rows, cols, options);
  auto out = method == NewtonSchulzMethod::kGram
                 ? gram_iteration(std::move(work), schedule, tall, options.symmetric())
                 : standard_iteration(std::move(work), schedule, tall, options.symmetric());
  if (out.scalar_type() != x.scalar_type()) out = out.to(x.scalar_type());
  return batched ? out : out.squeeze(0);
}

}  // namespace muon
