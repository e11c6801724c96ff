// Newton–Schulz on a matrix split over a group: all-reduced norm and Gram matrix.
#include "muon/distributed/newton_schulz.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <utility>

#include "kernels/symmetric.h"

namespace muon::dist {
namespace {

bool is_16bit(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Σ x² of a contiguous tensor, accumulated in fp64 (as newton_schulz does).
double sum_of_squares(const at::Tensor& x) {
  double s = 0.0;
  if (muon::detail::cblas_sum_of_squares(x, &s)) return s;
  const double n = at::linalg_vector_norm(x, 2, c10::nullopt, false, at::kDouble).item<double>();
  return n * n;
}

}  // namespace

at::Tensor distributed_newton_schulz(const at::Tensor& block, int64_t partition_dim,
                                     const Group& group, const NewtonSchulzOptions& options) {
  constexpr const char* who = "[muon::dist::distributed_newton_schulz] ";
  options.validate();
  TORCH_CHECK_VALUE(block.defined() && block.dim() == 2, who,
                    "block must be a 2-D tensor, got shape ",
                    block.defined() ? block.sizes() : c10::IntArrayRef{});
  TORCH_CHECK_VALUE(at::isFloatingType(block.scalar_type()), who,
                    "block must have a floating dtype, got ", block.scalar_type());
  TORCH_CHECK_VALUE(partition_dim == 0 || partition_dim == 1, who,
                    "partition_dim must be 0 or 1, got ", partition_dim);
  TORCH_CHECK_VALUE(block.size(1 - partition_dim) > 0, who, "block of shape ", block.sizes(),
                    " is empty in dim ", 1 - partition_dim,
                    ", which is not split; only the partition dim may be 0");
  const bool empty = block.numel() == 0;  // this rank holds no rows (columns)
  const auto compute = options.compute_dtype();
  TORCH_CHECK_VALUE(!(compute == at::kHalf && block.device().is_cpu()), who,
                    "compute_dtype Half is not supported on CPU; use BFloat16 or Float");
  const bool half = is_16bit(compute);
  const auto norm_dtype = compute == at::kDouble ? at::kDouble : at::kFloat;
  const bool symmetric = options.symmetric();

  // X₀ = G / (‖G‖_F·safety + eps): the norm's fp64 partial sums are all-reduced.
  auto m = at::empty(block.sizes(), block.options().dtype(norm_dtype));
  m.copy_(block);
  auto sumsq = at::full({1}, empty ? 0.0 : sum_of_squares(m), block.options().dtype(at::kDouble));
  group.all_reduce_(sumsq);
  m.div_(std::sqrt(sumsq.item<double>()) * options.coefficients().safety_factor + options.eps());
  auto x = (compute == norm_dtype ? m : m.to(compute)).unsqueeze(0);

  // Rows split: Gram of the columns (XᵀX, n×n), applied on the right.
  // Columns split: Gram of the rows (XXᵀ, m×m), applied on the left.
  const bool right = partition_dim == 0;
  const int64_t s = right ? block.size(1) : block.size(0);
  const auto state = half ? x.options().dtype(at::kFloat) : x.options();
  auto gram = at::empty({1, s, s}, state);
  auto poly = at::empty_like(gram);
  auto next = at::empty_like(x);
  for (const auto& k : options.schedule()) {
    if (empty) {
      gram.zero_();  // contributes nothing, still joins every all-reduce
    } else if (half) {
      muon::detail::syrk(gram, x.to(at::kFloat), right, 1.0, 0.0, symmetric);
    } else {
      muon::detail::syrk(gram, x, right, 1.0, 0.0, symmetric);
    }
    group.all_reduce_(gram);
    if (k.c != 0.0) {
      poly.copy_(gram);
      muon::detail::syrk(poly, gram, /*trans=*/false, k.c, k.b, symmetric);
    } else {
      at::mul_out(poly, gram, k.b);
    }
    if (empty) continue;
    if (half) {
      // As newton_schulz in 16 bits: a·I folded into the (fp32) polynomial,
      // rounded once, one product.
      poly.diagonal(0, 1, 2).add_(k.a);
      const auto p16 = poly.to(compute);
      muon::detail::batched_mm_out(next, right ? x : p16, right ? p16 : x);
    } else if (right) {
      muon::detail::batched_addmm_out(next, x, x, poly, k.a, 1.0);
    } else {
      muon::detail::batched_addmm_out(next, x, poly, x, k.a, 1.0);
    }
    std::swap(x, next);
  }
  auto out = x.squeeze(0);
  return out.scalar_type() == block.scalar_type() ? out : out.to(block.scalar_type());
}

}  // namespace muon::dist
