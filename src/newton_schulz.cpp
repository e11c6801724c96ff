// Newton–Schulz orthogonalization: standard and Gram evaluations of one
// polynomial schedule.
#include "muon/newton_schulz.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "kernels/fused_update.h"
#include "kernels/symmetric.h"
#include "newton_schulz_internal.h"
#include "util/threads.h"

namespace muon {
namespace {

using detail::batched_addmm_out;
using detail::batched_mm_out;
using detail::syrk;

bool is_16bit_dtype(at::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf;
}

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
    if (!scratch.p32.defined()) scratch.p32 = at::empty(p.sizes(), p.options().dtype(at::kFloat));
    const at::Tensor* a32 = &a_mat;
    if (is_16bit(a_mat)) {
      if (!scratch.a32.defined()) scratch.a32 = at::empty_like(scratch.p32);
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

// One standard step in bf16 where products accumulate into fp32 results
// (oneDNN on CPU): A = X·Xᵀ in fp32 from exact bf16 products; A rounded
// once to bf16 for A²; B = b·A + c·A² formed in fp32 (in A's buffer),
// a·I added and rounded once; X ← B·X in bf16. Every product is a bf16 one,
// A is never rounded before the b·A term, and only upper triangles are
// computed in fp32 (the bf16 copies are made whole in the same pass).
// With `sums`, A is completed in fp32 before use (see standard_iteration).
struct MixedStep {
  at::Tensor a32, a16, p16;

  void run(at::Tensor& next, const at::Tensor& x, const NsCoefficients& k, bool tall,
           const detail::PartialSums* sums) {
    if (!a32.defined()) {
      const int64_t s = tall ? x.size(2) : x.size(1);
      a32 = at::empty({x.size(0), s, s}, x.options().dtype(at::kFloat));
      a16 = at::empty(a32.sizes(), x.options());
      p16 = at::empty_like(a16);
    }
    const bool empty = x.numel() == 0;
    if (empty) {
      a32.zero_();
    } else {
      detail::syrk_upper(a32, x, tall, 1.0, 0.0);
    }
    if (sums != nullptr) sums->reduce_gram(a32);
    if (k.c != 0.0) {
      detail::symmetric_from_upper(a16, a32, 0.0);
      detail::syrk_upper(a32, a16, /*trans=*/false, k.c, k.b);
    } else {
      a32.mul_(k.b);
    }
    detail::symmetric_from_upper(p16, a32, k.a);
    if (!empty) batched_mm_out(next, tall ? x : p16, tall ? p16 : x);
  }
};

// The standard iteration, on the Gram matrix of the columns when `tall`.
// With `sums`, x is one block of a matrix split over processes: each Gram
// matrix is completed before use, in fp32 for 16-bit compute (16-bit
// partial sums would round before they are summed), and a block without
// rows (columns) forms zeros and no products but joins every reduction.
// Everything else, the 16-bit policy included, is the same code for one
// process and for many.
at::Tensor standard_iteration(at::Tensor x, const std::vector<NsCoefficients>& schedule,
                              bool tall, bool symmetric, const detail::PartialSums* sums) {
  auto next = at::empty_like(x);
  if (symmetric && x.scalar_type() == at::kBFloat16 && detail::accumulates_in_fp32(x)) {
    MixedStep step;
    for (const auto& k : schedule) {
      step.run(next, x, k, tall, sums);
      std::swap(x, next);
    }
    return x;
  }
  const int64_t s = tall ? x.size(2) : x.size(1);
  const bool fold = is_16bit(x);
  const bool gram32 = fold && sums != nullptr;
  auto poly = at::empty({x.size(0), s, s}, x.options());
  auto gram = at::empty(poly.sizes(), gram32 ? x.options().dtype(at::kFloat) : x.options());
  const bool empty = x.numel() == 0;
  PolyScratch scratch;
  for (const auto& k : schedule) {
    if (empty) {
      gram.zero_();
    } else if (gram32 && !detail::accumulates_in_fp32(x)) {
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
  auto r = at::empty({x.size(0), s, s}, state);
  auto z = at::empty_like(r);
  auto q = at::empty_like(r);
  auto work = at::empty_like(r);  // Q·M, then R·M
  auto next = at::empty_like(x);
  PolyScratch scratch;
  bool fresh = true;  // at the start of a phase Q = I, not yet formed

  // out = a·C + C·Z: products of polynomials in R₀, symmetric and commuting;
  // with symmetric kernels only their upper triangles are computed.
  auto times_m = [&](at::Tensor& out, const at::Tensor& c, const at::Tensor& lhs,
                     const at::Tensor& rhs, double a) {
    if (symmetric) {
      detail::commuting_addmm_out(out, c, lhs, rhs, a, 1.0);
    } else {
      batched_addmm_out(out, c, lhs, rhs, a, 1.0);
    }
  };
  const bool direct = !half || detail::accumulates_in_fp32(x);
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
  if (is_16bit_dtype(options.compute_dtype()) && wide && options.steps() >= kGramMinSteps) {
    return NewtonSchulzMethod::kGram;
  }
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
    if (starts_phase(restarts, k)) {
      f += 2.0 * s * s * l + sym * s * s * l;  // Q·X, new R
      fresh = true;
    }
    if (schedule[static_cast<size_t>(k)].c != 0.0) f += sym * s * s * s;
    if (!fresh) f += 2.0 * s * s * s;  // Q·Z
    fresh = false;
    if (k + 1 < n && !starts_phase(restarts, k + 1)) f += 4.0 * s * s * s;  // R·Z, Z·RZ
  }
  return f + 2.0 * s * s * l;  // final Q·X
}

namespace {
thread_local double ns_flops_counter = 0;
}  // namespace

double newton_schulz_flops_on_this_thread() { return ns_flops_counter; }

void reset_newton_schulz_flops_on_this_thread() { ns_flops_counter = 0; }

namespace detail {

double normalization_factor(double sum_of_squares, const NewtonSchulzOptions& options) {
  const double scaled = std::sqrt(sum_of_squares) * options.coefficients().safety_factor;
  return 1.0 / (options.eps_mode() == NsEpsMode::kClamp ? std::max(scaled, options.eps())
                                                         : scaled + options.eps());
}

// X₀ = G·normalization_factor per matrix. The scaling runs in fp32 (fp64
// for fp64 compute) and rounds once. ‖G‖² is summed in fp32 blocks of 256
// carried in fp64 (sum_of_squares, relative error ≲ 1e-6): LibTorch 1.13's
// fp32 norm is off by up to ~1e-4 relative on large matrices, a scale error
// the iteration amplifies, and its mixed-dtype reductions are ~40× slower.
at::Tensor newton_schulz_input(const at::Tensor& x3, const NewtonSchulzOptions& options,
                               const PartialSums* sums) {
  const auto compute = options.compute_dtype();
  const auto norm_dtype = compute == at::kDouble ? at::kDouble : at::kFloat;
  auto out = at::empty(x3.sizes(), x3.options().dtype(compute));
  if (!x3.device().is_cpu() && sums == nullptr) {
    auto denom = at::linalg_vector_norm(x3, 2, at::IntArrayRef{1, 2}, /*keepdim=*/true, at::kDouble);
    denom.mul_(options.coefficients().safety_factor);
    if (options.eps_mode() == NsEpsMode::kClamp) {
      denom.clamp_min_(options.eps());
    } else {
      denom.add_(options.eps());
    }
    out.copy_(x3.to(norm_dtype).div(denom.to(norm_dtype)));
    return out;
  }
  // CPU: one matrix at a time through a reused buffer (fresh 32 MB buffers
  // cost more in page faults than the arithmetic).
  at::Tensor buffer;
  for (int64_t i = 0; i < x3.size(0); ++i) {
    auto dst = out.select(0, i);
    at::Tensor m;
    if (compute == norm_dtype) {
      m = dst;  // scale in place in the output
    } else {
      if (!buffer.defined()) buffer = at::empty(dst.sizes(), dst.options().dtype(norm_dtype));
      m = buffer;
    }
    m.copy_(x3.select(0, i));
    double sumsq = sum_of_squares(m);  // fp32: as muon::Muon's fused step sums
    if (sums != nullptr) sums->reduce_sum_of_squares(sumsq);
    m.mul_(normalization_factor(sumsq, options));
    if (!m.is_same(dst)) dst.copy_(m);
  }
  return out;
}

at::Tensor standard_newton_schulz(at::Tensor x0, const NewtonSchulzOptions& options, bool columns,
                                  const PartialSums* sums) {
  std::optional<SixteenBitCompute> sixteen_bit;
  if (is_16bit_dtype(options.compute_dtype())) sixteen_bit.emplace();
  return standard_iteration(std::move(x0), options.schedule(), columns, options.symmetric(), sums);
}

at::Tensor newton_schulz_normalized(at::Tensor x0, const NewtonSchulzOptions& options) {
  const int64_t rows = x0.size(1);
  const int64_t cols = x0.size(2);
  const bool tall = rows > cols;
  ns_flops_counter += static_cast<double>(x0.size(0)) * newton_schulz_flops(rows, cols, options);
  std::optional<SixteenBitCompute> sixteen_bit;
  if (is_16bit_dtype(options.compute_dtype())) sixteen_bit.emplace();
  const auto schedule = options.schedule();
  return resolve_method(rows, cols, options) == NewtonSchulzMethod::kGram
             ? gram_iteration(std::move(x0), schedule, tall, options.symmetric())
             : standard_iteration(std::move(x0), schedule, tall, options.symmetric(), nullptr);
}

}  // namespace detail

at::Tensor newton_schulz(const at::Tensor& x, const NewtonSchulzOptions& options) {
  options.validate();
  detail::align_blas_threads();  // the BLAS pool no wider than LibTorch's
  check_input(x, options);
  if (x.numel() == 0) return at::zeros_like(x, at::MemoryFormat::Contiguous);

  const bool batched = x.dim() == 3;
  const auto x3 = batched ? x : x.unsqueeze(0);
  auto out = detail::newton_schulz_normalized(detail::newton_schulz_input(x3, options), options);
  if (out.scalar_type() != x.scalar_type()) out = out.to(x.scalar_type());
  return batched ? out : out.squeeze(0);
}

}  // namespace muon
