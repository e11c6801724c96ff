// The step's agreement: one all-gather of a few integers per step.
#include "distributed/layouts/step_agreement.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "distributed/runtime/agreement.h"
#include "distributed/runtime/max_over.h"
#include "muon/optim/settings_digest.h"
#include "muon/optim/step_guard.h"
#include "util/names.h"
#include "util/threads.h"

namespace muon::distributed::detail {
namespace {

constexpr size_t kShownRanks = 8;  // ranks listed in a message
constexpr int64_t kBitsPerWord = 63;  // bitmask bits per int64 (never the sign bit)

// The integers each rank sends, then the mask of present gradients.
enum Slot : size_t { kFailed, kBadIndex, kBadProblem, kNonFinite, kLarge, kDigest, kMask };

// Why a defined gradient cannot be reduced into (or step) its parameter.
enum GradProblem : int64_t { kGradOk = 0, kGradShape, kGradDtype, kGradDevice, kGradLayout };


// "[0, 2, 5]", at most kShownRanks of them, then "… (N ranks)".
std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string out = "[";
  for (const auto i : c10::irange(std::min(ranks.size(), kShownRanks))) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > kShownRanks) out += ", \u2026 (" + std::to_string(ranks.size()) + " ranks)";
  return out + "]";
}

GradProblem grad_problem(const at::Tensor& param, const at::Tensor& grad) {
  if (grad.layout() != at::kStrided) return kGradLayout;
  if (grad.sizes() != param.sizes()) return kGradShape;
  if (grad.scalar_type() != param.scalar_type()) return kGradDtype;
  if (grad.device() != param.device()) return kGradDevice;
  return kGradOk;
}

const char* problem_text(int64_t problem) {
  switch (problem) {
    case kGradShape: return "shape";
    case kGradDtype: return "dtype";
    case kGradDevice: return "device";
    default: return "layout (it must be dense)";
  }
}

NonFinitePolicy policy_of(torch::optim::Optimizer& optimizer) {
  auto* guard = muon::step_guard(optimizer);
  return guard != nullptr ? guard->nonfinite() : NonFinitePolicy::kPropagate;
}

// The largest magnitude a gradient may have for the sum over `ranks` of
// such gradients (in the reduction's accumulation type: fp32 for 16-bit
// floats) and its average to be finite: half the type's largest value over
// the ranks, which leaves room for the rounding of every partial sum.
double overflow_bound(at::ScalarType type, int64_t ranks) {
  const auto acc = (type == at::kHalf || type == at::kBFloat16) ? at::kFloat : type;
  const double largest = acc == at::kDouble ? std::numeric_limits<double>::max()
                                            : static_cast<double>(std::numeric_limits<float>::max());
  return largest / (2.0 * static_cast<double>(ranks));
}

// Every param group's settings, without the shapes of its tensors (the
// blocks and rows of tensor-parallel and sharded layouts differ by rank).
std::vector<AgreementItem> settings_items(const torch::optim::Optimizer& optimizer) {
  auto items = optimizer_items(optimizer);
  items.erase(std::remove_if(items.begin(), items.end(),
                             [](const AgreementItem& item) { return item.name.rfind("parameters of ", 0) == 0; }),
              items.end());
  return items;
}

// One param group's settings: its type and lr, then every field, read
// directly (a few hundred nanoseconds: it runs every step) from options that
// implement muon::DigestibleOptions and from LibTorch's element-wise
// optimizers' options; other types by their type and lr only.
void mix_options(SettingsDigest& mix, const torch::optim::OptimizerOptions& options) {
  mix(typeid(options).hash_code(), options.get_lr());
  if (const auto* o = dynamic_cast<const DigestibleOptions*>(&options)) {
    o->mix_settings(mix);
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    mix(std::get<0>(o->betas()), std::get<1>(o->betas()), o->eps(), o->weight_decay(), o->amsgrad());
  } else if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    mix(std::get<0>(o->betas()), std::get<1>(o->betas()), o->eps(), o->weight_decay(), o->amsgrad());
  } else if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    mix(o->momentum(), o->dampening(), o->weight_decay(), o->nesterov());
  }
}

// A digest of every param group's settings: equal settings give equal
// digests (a difference is then named from settings_items).
int64_t settings_digest(const torch::optim::Optimizer& optimizer) {
  SettingsDigest mix;
  for (const auto& group : optimizer.param_groups()) mix_options(mix, group.options());
  return signature_value(mix.value());
}

// This rank's integers (see Slot); `failure` keeps what its checks raised.
std::vector<int64_t> local_view(const StepCheck& check, std::exception_ptr& failure) {
  const auto& params = *check.params;
  const auto n = static_cast<int64_t>(params.size());
  std::vector<int64_t> mine(kMask + static_cast<size_t>((n + kBitsPerWord - 1) / kBitsPerWord), 0);
  mine[kBadIndex] = -1;
  mine[kNonFinite] = -1;
  try {
    if (auto* guard = muon::step_guard(*check.optimizer)) guard->check_before_step();
    if (check.same_groups) mine[kDigest] = settings_digest(*check.optimizer);
  } catch (const std::exception&) {
    mine[kFailed] = 1;
    failure = std::current_exception();
  }
  const bool finite_checked = policy_of(*check.optimizer) != NonFinitePolicy::kPropagate;
  for (const auto i : c10::irange(n)) {
    const auto& p = params[static_cast<size_t>(i)].value();
    const auto& g = p.grad();
    if (!g.defined()) continue;
    mine[kMask + static_cast<size_t>(i / kBitsPerWord)] |= int64_t{1} << (i % kBitsPerWord);
    const auto problem = grad_problem(p, g);
    if (problem != kGradOk) {
      if (mine[kBadIndex] < 0) {
        mine[kBadIndex] = i;
        mine[kBadProblem] = problem;
      }
      continue;
    }
    if (!finite_checked || mine[kNonFinite] >= 0 || g.numel() == 0) continue;
    if (!muon::detail::all_finite(g)) {
      mine[kNonFinite] = i;
    } else if (check.reduced_over > 1 && mine[kLarge] == 0 &&
               g.abs().max().item<double>() > overflow_bound(g.scalar_type(), check.reduced_over)) {
      mine[kLarge] = 1;
    }
  }
  return mine;
}

// Raises on every rank when some rank's gradients do not fit or differ in
// presence; returns which are present.
std::vector<bool> agreed_mask(const std::vector<std::vector<int64_t>>& all,
                              const torch::OrderedDict<std::string, at::Tensor>& params,
                              const Group& group, const char* who) {
  for (const auto r : c10::irange(all.size())) {
    if (all[r][kBadIndex] < 0) continue;
    const auto i = static_cast<size_t>(all[r][kBadIndex]);
    const auto& p = params[i].value();
    TORCH_CHECK_VALUE(false, who, "the gradient of parameter '", muon::detail::clip(params[i].key()), "' (shape ",
                      p.sizes(), ", ", p.scalar_type(), ") on rank ", r, " has another ",
                      problem_text(all[r][kBadProblem]), " than the parameter; nothing of this step "
                      "was applied");
  }
  std::vector<bool> active(params.size(), false);
  for (const auto i : c10::irange(params.size())) {
    const auto word = kMask + i / static_cast<size_t>(kBitsPerWord);
    const auto bit = int64_t{1} << (static_cast<int64_t>(i) % kBitsPerWord);
    std::vector<int64_t> with;
    std::vector<int64_t> without;
    for (const auto r : c10::irange(all.size())) {
      ((all[r][word] & bit) != 0 ? with : without).push_back(static_cast<int64_t>(r));
    }
    TORCH_CHECK_VALUE(with.empty() || without.empty(), who, "parameter '", muon::detail::clip(params[i].key()),
                      "' has a gradient on ranks ", rank_list(with), " and none on ranks ",
                      rank_list(without), " of group '", group.name(), "'; every rank must produce "
                      "it, or none (nothing of this step was applied)");
    active[i] = !with.empty();
  }
  return active;
}

// Raises (the same on every rank of `group`) for what `all`, the gathered
// integers of its ranks, shows; else adds the outcome to `verdict`.
void evaluate(const std::vector<std::vector<int64_t>>& all, const Group& group,
              const StepCheck& check, const std::exception_ptr& failure, StepVerdict& verdict) {
  const auto me = static_cast<size_t>(group.rank());
  for (const auto r : c10::irange(all.size())) {
    if (all[r][kFailed] == 0) continue;
    if (failure) std::rethrow_exception(failure);
    TORCH_CHECK_VALUE(false, check.who, "rank ", r, " of group '", group.name(),
                      "' failed its checks before the step (see its error); nothing of this "
                      "step was applied on any rank");
  }
  verdict.active = agreed_mask(all, *check.params, group, check.who);
  for (const auto r : c10::irange(all.size())) {
    if (all[r][kDigest] == all[me][kDigest]) continue;
    // Name the setting that differs (a collective every rank of the group
    // reaches: all saw the same digests).
    check_ranks_agree(group, settings_items(*check.optimizer), check.who,
                      "every rank must step with the same settings; set them on every rank");
    TORCH_CHECK_VALUE(false, check.who, "the ranks of group '", group.name(),
                      "' step with different settings; nothing of this step was applied");
  }
  for (const auto r : c10::irange(all.size())) {
    if (all[r][kNonFinite] < 0) continue;
    if (policy_of(*check.optimizer) == NonFinitePolicy::kSkipStep) {
      verdict.skip = true;
      break;
    }
    const auto i = static_cast<size_t>(all[r][kNonFinite]);
    TORCH_CHECK_VALUE(false, check.who, "parameter '", muon::detail::clip((*check.params)[i].key()), "' (shape ",
                      (*check.params)[i].value().sizes(), ") has a non-finite gradient (NaN or "
                      "Inf) on rank ", r, " of group '", group.name(), "'; nothing of this step "
                      "was applied. Set the nonfinite policy to skip_step to skip such steps, or "
                      "propagate to apply them");
  }
  for (const auto& v : all) verdict.recheck = verdict.recheck || v[kLarge] != 0;
}

}  // namespace

StepVerdict agree_step(const Group& group, const std::vector<const Group*>& peers,
                       const StepCheck& check) {
  // Every step passes here: the BLAS pool follows LibTorch's thread count.
  muon::detail::align_blas_threads();
  std::exception_ptr failure;
  const auto mine = local_view(check, failure);
  // One all-gather over `group` (no communication for one rank), or one
  // over each peer group; every rank takes part in each, whatever it found.
  const std::vector<const Group*> groups = peers.empty() ? std::vector<const Group*>{&group} : peers;
  StepVerdict verdict;
  std::exception_ptr raised;
  for (const auto* g : groups) {
    const auto all = g->all_gather_ints(mine);
    if (raised) continue;
    try {
      evaluate(all, *g, check, failure, verdict);
    } catch (const std::exception&) {
      raised = std::current_exception();
    }
  }
  // Several groups: the outcome passed on, so that a group that raises or
  // skips stops the ranks it shares only another group with.
  constexpr int64_t kSkipAll = 1;
  constexpr int64_t kFail = 2;
  if (groups.size() > 1) {
    const int64_t outcome = raised ? kFail : verdict.skip ? kSkipAll : 0;
    const auto [agreed, who] = max_over_groups(groups, outcome);
    if (agreed == kFail && !raised) {
      TORCH_CHECK_VALUE(false, check.who, "rank ", who, " of group '", groups[0]->name(),
                        "' or a peer in another group failed this step's checks (its message "
                        "names the parameter); nothing of this step was applied");
    }
    if (agreed == kSkipAll) verdict.skip = true;
  }
  if (raised) std::rethrow_exception(raised);
  return verdict;
}

bool agree_reduced_finite(const Group& group, const std::vector<const Group*>& peers,
                          const torch::OrderedDict<std::string, at::Tensor>& grads,
                          torch::optim::Optimizer& optimizer, const char* who) {
  int64_t first = -1;
  for (const auto i : c10::irange(grads.size())) {
    const auto& g = grads[i].value().grad();
    if (g.defined() && g.numel() > 0 && !muon::detail::all_finite(g)) {
      first = static_cast<int64_t>(i);
      break;
    }
  }
  const auto all = group.all_gather_ints({first});
  int64_t rank = -1;
  for (const auto r : c10::irange(all.size())) {
    if (all[r][0] >= 0 && rank < 0) rank = static_cast<int64_t>(r);
  }
  int64_t code = rank >= 0 ? 1 : 0;
  if (!peers.empty()) code = max_over_groups(peers, code).first;
  if (code == 0) return false;
  if (policy_of(optimizer) == NonFinitePolicy::kSkipStep) return true;
  TORCH_CHECK_VALUE(rank >= 0, who, "a peer in another group has a non-finite gradient (NaN or "
                    "Inf) after averaging; nothing of this step was applied");
  const auto i = static_cast<size_t>(all[static_cast<size_t>(rank)][0]);
  TORCH_CHECK_VALUE(false, who, "non-finite gradient (NaN or Inf) in parameter '",
                    muon::detail::clip(grads[i].key()), "' (shape ", grads[i].value().sizes(),
                    "), in the rows rank ", rank, " holds after averaging over the data-parallel "
                    "group (the ranks' gradients overflowed when summed); nothing was updated");
}

}  // namespace muon::distributed::detail
