// The checks before a step: options, parameters, gradients, non-finite
// values, agreed over the processes of a layout.
#include "muon/optim/step_guard.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <unordered_map>

#include "optim/closure.h"
#include "optim/step_transaction.h"
#include "util/names.h"
#include "util/threads.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;

constexpr detail::EnumName<NonFinitePolicy> kPolicies[] = {
    {NonFinitePolicy::kError, "error"},
    {NonFinitePolicy::kSkipStep, "skip_step"},
    {NonFinitePolicy::kPropagate, "propagate"}};

// Outcomes of a process's checks, ordered: the largest over the processes wins.
enum Code : int64_t { kFine = 0, kSkip = 1, kNonFiniteError = 2, kCheckFailed = 3 };

// True when no element of `n` words of `bits` has an all-ones exponent
// (`exponent` masks it): IEEE NaN and ±Inf, and nothing else. Integer
// compares, so it vectorizes and no floating-point flag is raised.
template <typename Word>
bool exponents_finite(const Word* bits, int64_t n, Word exponent) {
  bool finite = true;
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    Word bad = 0;
    for (int64_t i = begin; i < end; ++i) bad |= static_cast<Word>((bits[i] & exponent) == exponent);
    if (bad != 0) finite = false;  // benign race: only ever written false
  });
  return finite;
}

std::string describe_or_default(const std::function<std::string(size_t, size_t)>& describe,
                                const OptimizerParamGroup& group, size_t g, size_t i) {
  return describe ? describe(g, i) : detail::describe_param(group.params()[i], g, i);
}

}  // namespace

MUON_DEFINE_ENUM_NAMES(NonFinitePolicy, parse_nonfinite_policy, kPolicies, "[muon] ", "nonfinite policy");

std::vector<std::string> nonfinite_policy_names() { return detail::names_of(kPolicies); }

std::pair<int64_t, int64_t> StepGuard::max_over_processes(int64_t code) { return {code, 0}; }

at::Tensor StepGuard::guarded_step(torch::optim::Optimizer& optimizer,
                                  const torch::optim::Optimizer::LossClosure& closure,
                                  const char* who, const std::function<void()>& local_checks,
                                  const std::function<void()>& update) {
  at::NoGradGuard no_grad;
  at::Tensor loss = detail::loss_of(closure);
  // Options changed or groups added since, gradients, non-finite values:
  // checked for every group before anything changes, agreed over the layout.
  if (!admit_step(optimizer.param_groups(), who, local_checks)) return loss;
  // A part of a composite: the composite's step is the transaction.
  if (is_checked_by_owner()) {
    update();
  } else {
    detail::run_whole_step(optimizer, who, update);
  }
  return loss;
}

bool StepGuard::admit_step(const std::vector<OptimizerParamGroup>& groups, const char* who,
                           const std::function<void()>& local_checks, const Describe& describe) {
  if (checked_by_owner_ || agreed_by_layout_) return true;
  // Every optimizer's step passes here: the BLAS pool follows LibTorch's
  // thread count (a no-op unless that count changed or the user chose one).
  detail::align_blas_threads();
  int64_t code = kFine;
  std::exception_ptr failure;
  std::string nonfinite_param;
  try {
    if (local_checks) local_checks();
    detail::check_gradients(groups, who, describe);
    if (policy_ != NonFinitePolicy::kPropagate) {
      for (const auto g : c10::irange(groups.size()) ) {
        const auto& params = groups[g].params();
        for (const auto i : c10::irange(params.size())) {
          const auto& grad = params[i].grad();
          if (!grad.defined() || detail::all_finite(grad)) continue;
          nonfinite_param = describe_or_default(describe, groups[g], g, i);
          break;
        }
        if (!nonfinite_param.empty()) break;
      }
      if (!nonfinite_param.empty()) {
        code = policy_ == NonFinitePolicy::kSkipStep ? kSkip : kNonFiniteError;
      }
    }
  } catch (const std::exception&) {
    code = kCheckFailed;
    failure = std::current_exception();
  }
  const auto [worst, rank] = max_over_processes(code);
  if (failure) std::rethrow_exception(failure);
  switch (worst) {
    case kFine:
      return true;
    case kSkip:
      ++skipped_;
      return false;
    case kNonFiniteError:
      TORCH_CHECK_VALUE(code != kNonFiniteError, who, nonfinite_param,
                        " has a non-finite gradient (NaN or Inf); nothing of this step was "
                        "applied. Set the nonfinite policy to skip_step to skip such steps, or "
                        "propagate to apply them");
      TORCH_CHECK_VALUE(false, who, "rank ", rank, " has a non-finite gradient (NaN or Inf; see "
                        "its error); nothing of this step was applied on any rank");
    default:
      TORCH_CHECK_VALUE(false, who, "rank ", rank, " failed its checks before the step (see its "
                        "error); nothing of this step was applied on any rank");
  }
}

StepGuard* step_guard(torch::optim::Optimizer& optimizer) {
  return dynamic_cast<StepGuard*>(&optimizer);
}

namespace detail {

bool all_finite(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return true;
  if (t.device().is_cpu() && t.is_contiguous() && !t.is_sparse()) {
    const auto bits = [&](auto exponent_mask) {
      using Bits = decltype(exponent_mask);
      return exponents_finite(static_cast<const Bits*>(t.data_ptr()), t.numel(), exponent_mask);
    };
    switch (t.scalar_type()) {
      case at::kFloat:
        return bits(uint32_t{0x7F800000u});
      case at::kDouble:
        return bits(uint64_t{0x7FF0000000000000ull});
      case at::kBFloat16:
        return bits(uint16_t{0x7F80u});
      case at::kHalf:
        return bits(uint16_t{0x7C00u});
      default:
        break;
    }
  }
  return at::isfinite(t).all().item<bool>();
}

std::string describe_param(const at::Tensor& param, size_t group, size_t index) {
  return c10::str("parameter ", index, " of group ", group, " (shape ", param.sizes(), ")");
}

void check_steppable(const std::vector<OptimizerParamGroup>& groups, const char* who,
                     const std::function<std::string(size_t, size_t)>& describe) {
  std::unordered_map<const void*, std::pair<size_t, size_t>> seen;
  for (const auto g : c10::irange(groups.size())) {
    const auto& params = groups[g].params();
    for (const auto i : c10::irange(params.size())) {
      const auto& p = params[i];
      TORCH_CHECK_VALUE(p.defined(), who, "parameter ", i, " of group ", g, " is undefined");
      const auto name = [&] { return describe_or_default(describe, groups[g], g, i); };
      TORCH_CHECK_VALUE(at::isFloatingType(p.scalar_type()), who, name(),
                        " must have a floating dtype, got ", p.scalar_type());
      TORCH_CHECK_VALUE(!(p.scalar_type() == at::kHalf && p.device().is_cpu()), who, name(),
                        " is float16 on CPU, which LibTorch's CPU kernels do not fully support; "
                        "use float32 or bfloat16 on CPU (float16 works on CUDA)");
      TORCH_CHECK_VALUE(at::has_internal_overlap(p) != at::MemOverlap::Yes, who, name(),
                        " has elements that share memory (strides ", p.strides(),
                        ", e.g. an expanded tensor); an in-place update would write one element "
                        "for several. Pass a tensor of its own, e.g. .contiguous() or .clone()");
      const auto [it, inserted] = seen.emplace(p.unsafeGetTensorImpl(), std::make_pair(g, i));
      TORCH_CHECK_VALUE(inserted, who, "some parameters appear in more than one parameter group: ",
                        describe_or_default(describe, groups[it->second.first], it->second.first,
                                            it->second.second),
                        " and ", name(), " are the same tensor");
    }
  }
}

void check_gradients(const std::vector<OptimizerParamGroup>& groups, const char* who,
                     const std::function<std::string(size_t, size_t)>& describe) {
  for (const auto g : c10::irange(groups.size())) {
    const auto& params = groups[g].params();
    for (const auto i : c10::irange(params.size())) {
      const auto& p = params[i];
      const auto& grad = p.grad();
      if (!grad.defined()) continue;
      const auto name = [&] { return describe_or_default(describe, groups[g], g, i); };
      TORCH_CHECK_VALUE(!grad.is_sparse(), who, "the gradient of ", name(),
                        " is sparse; sparse gradients are not supported");
      TORCH_CHECK_VALUE(grad.sizes() == p.sizes(), who, "the gradient of ", name(),
                        " has shape ", grad.sizes(), ", the parameter has shape ", p.sizes(),
                        "; they must be equal");
      TORCH_CHECK_VALUE(grad.scalar_type() == p.scalar_type(), who, "the gradient of ", name(),
                        " has dtype ", grad.scalar_type(), ", the parameter has dtype ",
                        p.scalar_type(), "; they must be equal");
      TORCH_CHECK_VALUE(grad.device() == p.device(), who, "the gradient of ", name(),
                        " is on ", grad.device(), ", the parameter on ", p.device(),
                        "; they must be on the same device");
    }
  }
}

namespace {

void check_finite_at_least(double value, double low, const char* who, const char* name,
                           size_t group) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value >= low, who, name, " of group ", group,
                    " must be finite and >= ", low, ", got ", value);
}

void check_beta(double value, const char* who, const char* name, size_t group) {
  TORCH_CHECK_VALUE(value >= 0 && value < 1, who, name, " of group ", group,
                    " must be in [0, 1), got ", value);
}

// AdamW's and Adam's options: the same fields, the same rules.
template <typename Options>
void check_adam_like(const Options& o, const char* who, size_t group) {
  check_finite_at_least(o.lr(), 0, who, "lr", group);
  check_finite_at_least(o.eps(), 0, who, "eps", group);
  check_finite_at_least(o.weight_decay(), 0, who, "weight_decay", group);
  check_beta(std::get<0>(o.betas()), who, "betas[0]", group);
  check_beta(std::get<1>(o.betas()), who, "betas[1]", group);
}

}  // namespace

void check_torch_options(const torch::optim::OptimizerOptions& options, const char* who,
                         size_t group) {
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    check_adam_like(*o, who, group);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    check_adam_like(*o, who, group);
  } else if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    check_finite_at_least(o->lr(), 0, who, "lr", group);
    check_finite_at_least(o->momentum(), 0, who, "momentum", group);
    check_finite_at_least(o->weight_decay(), 0, who, "weight_decay", group);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdagradOptions*>(&options)) {
    check_finite_at_least(o->lr(), 0, who, "lr", group);
    check_finite_at_least(o->eps(), 0, who, "eps", group);
    check_finite_at_least(o->weight_decay(), 0, who, "weight_decay", group);
  } else if (const auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    check_finite_at_least(o->lr(), 0, who, "lr", group);
    check_finite_at_least(o->eps(), 0, who, "eps", group);
    check_finite_at_least(o->weight_decay(), 0, who, "weight_decay", group);
    check_finite_at_least(o->momentum(), 0, who, "momentum", group);
  }
}

}  // namespace detail
}  // namespace muon
