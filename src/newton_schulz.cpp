// Newton–Schulz orthogonalization: standard and Gram evaluations of one
// polynomial schedule. Here: the entry points (checks, the method for a
// shape, normalization, the iteration per method, the per-thread FLOP
// counter); the iterations are in newton_schulz_iteration.cpp, the FLOP
// counts in newton_schulz_flops.cpp.
#include "muon/newton_schulz.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "kernels/cuda.h"
#include "kernels/fused_update.h"
#include "kernels/symmetric.h"
#include "newton_schulz_internal.h"
#include "newton_schulz_iteration.h"
#include "util/threads.h"

namespace muon {
namespace {

using detail::is_16bit_dtype;

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

NewtonSchulzMethod resolve_method(int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                                  c10::Device device) {
  if (options.method() != NewtonSchulzMethod::kAuto || !device.is_cuda()) {
    return resolve_method(rows, cols, options);
  }
  const double s = static_cast<double>(std::min(rows, cols));
  const double l = static_cast<double>(std::max(rows, cols));
  const bool wide = s >= 1 && l / s >= kGramMinAspectCuda;
  return is_16bit_dtype(options.compute_dtype()) && wide && options.steps() >= kGramMinSteps
             ? NewtonSchulzMethod::kGram
             : NewtonSchulzMethod::kStandard;
}

double newton_schulz_flops(int64_t rows, int64_t cols, const NewtonSchulzOptions& options,
                           c10::Device device) {
  auto resolved = options;
  resolved.method(resolve_method(rows, cols, options, device));
  return newton_schulz_flops(rows, cols, resolved);
}

bool cuda_kernels_available() { return detail::cuda_kernels_built(); }

std::string newton_schulz_cpu_kernels(at::ScalarType compute_dtype) {
  if (compute_dtype == at::kDouble) {
    const auto core = detail::blas_core_name();
    return std::string("fp64 products: ") +
           (core.empty() ? "ATen's BLAS" : "OpenBLAS (" + core + " kernels), SYRK for symmetric products");
  }
  return detail::describe_cpu_products(compute_dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat);
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
  const auto device = x0.device();
  ns_flops_counter +=
      static_cast<double>(x0.size(0)) * newton_schulz_flops(rows, cols, options, device);
  std::optional<SixteenBitCompute> sixteen_bit;
  if (is_16bit_dtype(options.compute_dtype())) sixteen_bit.emplace();
  const auto schedule = options.schedule();
  return resolve_method(rows, cols, options, device) == NewtonSchulzMethod::kGram
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
