// The two iterations of Newton–Schulz on a normalized input: the standard
// one (X ← a·X + B·X per step, with a bf16 step that sums exact products
// in fp32) and Gram Newton–Schulz (phases that accumulate the step
// matrices from the Gram matrix and apply them to X once per phase).
#include "newton_schulz_iteration.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/symmetric.h"
#include "util/scratch.h"

namespace muon::detail {
namespace {

bool is_16bit(const at::Tensor& t) { return is_16bit_dtype(t.scalar_type()); }

// The s×s part of one step's polynomial, B = b·A + c·A² (A symmetric).
// The identity term a·I is never folded in: X ← a·X + B·X keeps a·X with
// its own rounding, which carries the directions of small singular values
// (where p(σ) ≈ a·σ); folded into one GEMM they would take the GEMM's error,
// relative to whole rows (3× the plain formula's error on decaying spectra).
// fp32 scratch for forming 16-bit step polynomials, allocated once per call.
struct PolyScratch {
  at::Tensor a32;
  at::Tensor p32;
};

// A is in p's dtype, or fp32 for a 16-bit p (a Gram matrix summed over
// processes).
void step_polynomial(at::Tensor& p, const at::Tensor& a_mat, const NsCoefficients& k,
                     bool symmetric, PolyScratch& scratch) {
  if (is_16bit(p)) {
    // b·A + c·A² cancels heavily (polar_express step 1 near σ = 1:
    // −21.6 + 14.6); in 16-bit it loses most digits. B is s×s: form it in
    // fp32 and round once.
    if (!scratch.p32.defined()) {
      scratch.p32 = scratch_empty(p.sizes(), p.options().dtype(at::kFloat));
    }
    const at::Tensor* a32 = &a_mat;
    if (is_16bit(a_mat)) {
      if (!scratch.a32.defined()) {
        scratch.a32 = scratch_empty(scratch.p32.sizes(), scratch.p32.options());
      }
      scratch.a32.copy_(a_mat);
      a32 = &scratch.a32;
    }
    step_polynomial(scratch.p32, *a32, k, symmetric, scratch);
    p.copy_(scratch.p32);
    return;
  }
  if (k.c != 0.0) {
    p.copy_(a_mat);
    syrk(p, a_mat, /*trans=*/false, k.c, k.b, symmetric);
  } else {
    at::mul_out(p, a_mat, k.b);
  }
}

// out = alpha·x + B·x (wide) or alpha·x + x·B (tall); B symmetric.
void axpy_apply(at::Tensor& out, double alpha, const at::Tensor& b, const at::Tensor& x,
                bool tall) {
  if (tall) {
    batched_addmm_out(out, x, x, b, alpha, 1.0);
  } else {
    batched_addmm_out(out, x, b, x, alpha, 1.0);
  }
}

// α ≈ a + mean(diag B) per matrix of a32 (contiguous CPU fp32, upper
// triangles), B's diagonal shifted by a − α in place (a plain loop, no
// dispatches). α keeps 5 significant bits: oneDNN bakes the sum post-op's
// scale into the primitive, so a coarse α keeps the primitive cache hit
// from one call to the next; the diagonal left to round is then at most
// |B_ii − mean| + α/32, still far below a + B_ii.
void shift_to_alpha(at::Tensor& a32, double a, std::vector<double>& alpha) {
  const int64_t s = a32.size(1);
  alpha.resize(static_cast<size_t>(a32.size(0)));
  float* data = a32.data_ptr<float>();
  for (int64_t i = 0; i < a32.size(0); ++i) {
    float* m = data + i * s * s;
    double sum = 0;
    for (int64_t j = 0; j < s; ++j) sum += m[j * s + j];
    const double mean = s > 0 ? sum / static_cast<double>(s) : 0.0;
    int e = 0;
    const double frac = std::frexp(a + mean, &e);  // α = frac·2^e, |frac| in [0.5, 1)
    const double a_q = std::ldexp(std::nearbyint(frac * 32.0) / 32.0, e);
    const auto shift = static_cast<float>(a_q - a);
    for (int64_t j = 0; j < s; ++j) m[j * s + j] -= shift;
    alpha[static_cast<size_t>(i)] = a_q;
  }
}

// next = α·X + P·X (wide) or α·X + X·P (tall), α per matrix: one call for
// the batch when every matrix has the same (coarse) α, as matrices of
// similar spectra do; else one call per matrix.
void apply_step(at::Tensor& next, const at::Tensor& x, const at::Tensor& p,
                const std::vector<double>& alpha, bool tall) {
  if (std::all_of(alpha.begin(), alpha.end(), [&](double v) { return v == alpha[0]; })) {
    batched_addmm_out(next, x, tall ? x : p, tall ? p : x, alpha[0], 1.0);
    return;
  }
  for (int64_t i = 0; i < x.size(0); ++i) {
    auto out = next.narrow(0, i, 1);
    const auto xi = x.narrow(0, i, 1);
    const auto pi = p.narrow(0, i, 1);
    batched_addmm_out(out, xi, tall ? xi : pi, tall ? pi : xi, alpha[static_cast<size_t>(i)], 1.0);
  }
}

// One standard step in bf16 where products sum exact bf16 products in fp32
// (every CPU: oneDNN's bf16 matmul, or widened operands; CUDA: cuBLAS's
// bf16 products with fp32 results, where α stays a: see run). A = X·Xᵀ is
// summed in fp32 from exact bf16 products and rounded once to bf16;
// B = b·A + c·A² is formed in fp32 from that one rounded A in both terms,
// so that B is a polynomial of one symmetric matrix (an fp32 A in the
// linear term beside its bf16 rounding in the square adds their
// difference, unsmoothed, to every step). The step is
// X ← α·X + (B + (a − α)·I)·X in one bf16 GEMM that adds α·X in fp32
// before the one rounding (oneDNN's sum post-op, or β·C of the fp32 GEMM),
// with α = a + mean(diag B): the rounded s×s matrix then has a diagonal
// near zero instead of a + B_ii, whose 8-bit rounding would scale each row
// of X by up to 2⁻⁸ (the directions of small singular values, where
// p(σ) ≈ a·σ, carry it to the output). Only upper triangles are computed
// in fp32 (the bf16 copies are made whole in the same pass). With `sums`,
// A is completed in fp32 before use (see standard_iteration); every
// process then forms the same B and α.
struct Bf16Step {
  // Bf16Products::kWidened (no native bf16 matmul on this CPU): the
  // iterate, the rounded A and the rounded step matrix are fp32 tensors
  // holding bf16 values, each result rounded to bf16 values in place where
  // the bf16 step rounds it. Same arithmetic (each product of two bf16
  // values is exact in fp32, sums in fp32, one rounding), and fp32 GEMMs
  // read the iterate as it is, without widening it for every product; the
  // step matrix is rounded in place and used as it is.
  bool widened = false;
  at::Tensor a32, ar, p16;  // ar: in the iterate's dtype; p16: native only
  std::vector<double> alpha;

  void run(at::Tensor& next, const at::Tensor& x, const NsCoefficients& k, bool tall,
           const PartialSums* sums) {
    if (!a32.defined()) {
      const int64_t s = tall ? x.size(2) : x.size(1);
      a32 = scratch_empty({x.size(0), s, s}, x.options().dtype(at::kFloat));
      ar = scratch_empty(a32.sizes(), x.options());
      if (!widened) p16 = scratch_empty(a32.sizes(), x.options());
    }
    const bool empty = x.numel() == 0;
    bool whole = false;  // a32 holds both triangles
    if (empty) {
      a32.zero_();
      whole = true;
    } else {
      whole = syrk_upper(a32, x, tall, 1.0, 0.0);
    }
    if (sums != nullptr) sums->reduce_gram(a32);  // keeps a symmetric matrix symmetric
    if (k.c != 0.0) {
      if (widened) {
        if (!whole) mirror_upper_to_lower(a32);
        round_to_bf16_values(a32);
        ar.copy_(a32);
      } else {
        symmetric_from_upper(ar, a32, 0.0);
        a32.copy_(ar);
      }
      whole = syrk_upper(a32, ar, /*trans=*/false, k.c, k.b);
    } else {
      a32.mul_(k.b);
    }
    if (a32.is_cuda()) {
      // The GEMM's β must be known on the host: α = a, no shift, rather
      // than a synchronization per step.
      alpha.assign(static_cast<size_t>(a32.size(0)), k.a);
    } else {
      shift_to_alpha(a32, k.a, alpha);
    }
    const at::Tensor* p = &a32;
    if (widened) {
      if (!whole) mirror_upper_to_lower(a32);
      round_to_bf16_values(a32);
    } else {
      symmetric_from_upper(p16, a32, 0.0);
      p = &p16;
    }
    if (empty) return;
    apply_step(next, x, *p, alpha, tall);
    if (widened) round_to_bf16_values(next);
  }
};

}  // namespace

// The standard iteration, on the Gram matrix of the columns when `tall`.
// With `sums`, x is one block of a matrix split over processes: each Gram
// matrix is completed before use, in fp32 for 16-bit compute (16-bit
// partial sums would round before they are summed), and a block without
// rows (columns) forms zeros and no products but joins every reduction.
// Everything else, the 16-bit policy included, is the same code for one
// process and for many.
at::Tensor standard_iteration(at::Tensor x, const std::vector<NsCoefficients>& schedule,
                              bool tall, bool symmetric, const PartialSums* sums) {
  if (symmetric && x.scalar_type() == at::kBFloat16 && accumulates_in_fp32(x)) {
    Bf16Step step;
    step.widened = bf16_products() == Bf16Products::kWidened;
    if (step.widened) x = x.to(at::kFloat);  // exact: bf16 values in fp32 from here on
    auto next = scratch_empty(x.sizes(), x.options());
    for (const auto& k : schedule) {
      step.run(next, x, k, tall, sums);
      std::swap(x, next);
    }
    return step.widened ? x.to(at::kBFloat16) : x;  // exact
  }
  auto next = scratch_empty(x.sizes(), x.options());
  const int64_t s = tall ? x.size(2) : x.size(1);
  const bool fold = is_16bit(x);
  const bool gram32 = fold && sums != nullptr;
  auto poly = scratch_empty({x.size(0), s, s}, x.options());
  auto gram =
      scratch_empty(poly.sizes(), gram32 ? x.options().dtype(at::kFloat) : x.options());
  const bool empty = x.numel() == 0;
  PolyScratch scratch;
  for (const auto& k : schedule) {
    if (empty) {
      gram.zero_();
    } else if (gram32 && !accumulates_in_fp32(x)) {
      syrk(gram, x.to(at::kFloat), tall, 1.0, 0.0, symmetric);
    } else {
      syrk(gram, x, tall, 1.0, 0.0, symmetric);
    }
    if (sums != nullptr) sums->reduce_gram(gram);
    step_polynomial(poly, gram, k, symmetric, scratch);
    if (empty) continue;
    if (fold) {
      // 16-bit: the output's own rounding (2⁻⁸) dominates, so a·I goes into
      // the s×s polynomial and the step is one GEMM (16-bit GEMMs with
      // β ≠ 0 run ~15% slower in oneDNN).
      poly.diagonal(0, 1, 2).add_(k.a);
      batched_mm_out(next, tall ? x : poly, tall ? poly : x);
    } else {
      axpy_apply(next, k.a, poly, x, tall);
    }
    std::swap(x, next);
  }
  return x;
}

// Gram Newton–Schulz phases: at most three steps each, balanced, with a
// final phase of at most two (its rounding is what reaches the output).
// Returns the 0-based steps that start a phase after the first.
std::vector<int64_t> gram_restarts(int64_t steps) {
  std::vector<int64_t> starts;
  const int64_t last = std::min<int64_t>(2, steps);
  const int64_t head = steps - last;
  const int64_t phases = (head + 2) / 3;  // ceil(head / 3)
  int64_t at = 0;
  for (int64_t p = 0; p < phases; ++p) {
    at += head / phases + (p < head % phases ? 1 : 0);
    starts.push_back(at);
  }
  return starts;
}

bool starts_phase(const std::vector<int64_t>& restarts, int64_t k) {
  return std::find(restarts.begin(), restarts.end(), k) != restarts.end();
}

// Gram Newton–Schulz (Zhang, Amsel, Chen, Dao 2026). With R = X·Xᵀ and the
// step matrix M = a·I + Z, Z = b·R + c·R², a phase accumulates
// Q = M₁·M₂⋯ (Q ← Q·Z + a·Q) and R ← M·R·M (as R·Z + a·R, then
// Z·RZ + a·RZ), and applies X ← Qᵀ·X (wide) or X·Q (tall) once; all s×s
// matrices are polynomials in R₀ and commute. R squares the condition
// number of the iterate, so in fp32 small singular directions see more
// rounding than in the standard iteration (docs/benchmarks.md); in 16-bit
// the iterate's own rounding dominates and Gram is the more accurate.
at::Tensor gram_iteration(at::Tensor x, const std::vector<NsCoefficients>& schedule, bool tall,
                          bool symmetric) {
  const int64_t s = tall ? x.size(2) : x.size(1);
  const auto n = static_cast<int64_t>(schedule.size());
  const auto restarts = gram_restarts(n);
  // 16-bit compute keeps the s×s state (R, Z, Q) in fp32: rounded to 16
  // bits, R's small eigenvalues are lost and the polynomial recurrence can
  // diverge on ill-conditioned inputs. Only Q·X runs in 16 bits. R comes
  // from the bf16 iterate's exact products summed in fp32 where the backend
  // allows (oneDNN on CPU), else from an fp32 SYRK of the iterate.
  const bool half = is_16bit(x);
  const auto state = half ? x.options().dtype(at::kFloat) : x.options();
  auto r = scratch_empty({x.size(0), s, s}, state);
  auto z = scratch_empty(r.sizes(), state);
  auto q = scratch_empty(r.sizes(), state);
  auto work = scratch_empty(r.sizes(), state);  // Q·M, then R·M
  auto next = scratch_empty(x.sizes(), x.options());
  PolyScratch scratch;
  bool fresh = true;  // at the start of a phase Q = I, not yet formed

  // out = a·C + C·Z: products of polynomials in R₀, symmetric and commuting;
  // with symmetric kernels only their upper triangles are computed.
  auto times_m = [&](at::Tensor& out, const at::Tensor& c, const at::Tensor& lhs,
                     const at::Tensor& rhs, double a) {
    if (symmetric) {
      commuting_addmm_out(out, c, lhs, rhs, a, 1.0);
    } else {
      batched_addmm_out(out, c, lhs, rhs, a, 1.0);
    }
  };
  const bool direct = !half || accumulates_in_fp32(x);
  auto gram_of_x = [&] {
    if (!direct) {
      syrk(r, x.to(at::kFloat), tall, 1.0, 0.0, symmetric);
    } else {
      syrk(r, x, tall, 1.0, 0.0, symmetric);
    }
  };
  auto apply_q = [&] {
    const auto qx = half ? q.to(x.scalar_type()) : q;
    batched_mm_out(next, tall ? x : qx.transpose(1, 2), tall ? qx : x);
    std::swap(x, next);
  };
  gram_of_x();
  for (int64_t k = 0; k < n; ++k) {
    if (starts_phase(restarts, k)) {
      apply_q();
      gram_of_x();
      fresh = true;
    }
    const auto& c = schedule[static_cast<size_t>(k)];
    step_polynomial(z, r, c, symmetric, scratch);
    if (fresh) {
      q.copy_(z);
      q.diagonal(0, 1, 2).add_(c.a);
      fresh = false;
    } else {
      times_m(work, q, q, z, c.a);
      std::swap(q, work);
    }
    if (k + 1 < n && !starts_phase(restarts, k + 1)) {
      times_m(work, r, r, z, c.a);  // R·M
      times_m(r, work, z, work, c.a);  // M·R·M
    }
  }
  apply_q();
  return x;
}

}  // namespace muon::detail
