// Weight-update hooks (muon/optim/weight_update_hook.h).
#include "muon/optim/weight_update_hook.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "optim/option_checks.h"
#include "util/names.h"
#include "util/scale.h"

namespace muon {
namespace {

constexpr const char* kWho = "[muon::WeightUpdateHook] ";

constexpr detail::EnumName<WeightUpdateHookKind> kHookNames[] = {
    {WeightUpdateHookKind::kNone, "none"},
    {WeightUpdateHookKind::kHyperball, "hyperball"},
    {WeightUpdateHookKind::kRadialBrake, "radial_brake"},
    {WeightUpdateHookKind::kRelativeUpdate, "relative_update"},
};

constexpr detail::EnumName<HookedWeightDecay> kDecayNames[] = {
    {HookedWeightDecay::kDecoupled, "decoupled"},
    {HookedWeightDecay::kIndependent, "independent"},
    {HookedWeightDecay::kL2, "l2"},
    {HookedWeightDecay::kPalm, "palm"},
};

// The factor c of p ← c·p − lr·U (no decay: 1, whatever its kind).
double decay_factor(const std::optional<HookedWeightDecay>& decay, double weight_decay, double lr) {
  if (weight_decay == 0 || !decay) return 1.0;
  switch (*decay) {
    case HookedWeightDecay::kDecoupled:
      return 1 - lr * weight_decay;
    case HookedWeightDecay::kIndependent:
      return 1 - weight_decay;
    case HookedWeightDecay::kPalm:
      return 1 - lr * lr * weight_decay;
    case HookedWeightDecay::kL2:
      break;
  }
  return 1.0;
}

// The norm of a sum of squares, 0 below eps (Emerging-Optimizers' numerical zero).
double norm_or_zero(double square_sum, double eps) {
  const double norm = std::sqrt(square_sum);
  return norm < eps ? 0.0 : norm;
}

double square_sum(const at::Tensor& t) { return t.square().sum().item<double>(); }

}  // namespace

MUON_DEFINE_ENUM_NAMES(WeightUpdateHookKind, parse_weight_update_hook, kHookNames, kWho, "weight_update_hook");

std::vector<std::string> weight_update_hook_names() {
  std::vector<std::string> out;
  for (const auto& n : kHookNames) out.emplace_back(n.name);
  return out;
}

std::optional<HookedWeightDecay> try_parse_hooked_weight_decay(const std::string& name) {
  for (const auto& n : kDecayNames) {
    if (name == n.name) return n.value;
  }
  return std::nullopt;
}

std::string hooked_weight_decay_refusal(const std::string& name, const std::string& field) {
  return c10::str("a weight_update_hook needs a weight decay that scales the weight by a factor (decoupled, ",
                  "independent, l2 or palm); ", field, " is '", detail::clip(name), "'");
}

HookedWeightDecay parse_hooked_weight_decay(const std::string& name, const std::string& field) {
  const auto decay = try_parse_hooked_weight_decay(name);
  TORCH_CHECK_VALUE(decay, kWho, hooked_weight_decay_refusal(name, field));
  return *decay;
}

void WeightUpdateHookOptions::validate() const {
  detail::check_finite_positive(kWho, "eps", eps_);
  TORCH_CHECK_VALUE(std::isfinite(radius_) && radius_ >= eps_, kWho, "radius must be finite and >= eps (",
                    eps_, "), got ", radius_);
  TORCH_CHECK_VALUE(outward_scale_ >= 0 && outward_scale_ <= 1, kWho, "outward_scale must be in [0, 1], got ",
                    outward_scale_);
  TORCH_CHECK_VALUE(inward_scale_ >= 0 && inward_scale_ <= 1, kWho, "inward_scale must be in [0, 1], got ",
                    inward_scale_);
}

WeightUpdateHooks::WeightUpdateHooks(std::vector<std::optional<Group>> groups, SumAcrossParts sum)
    : groups_(std::move(groups)), sum_(std::move(sum)) {
  for (const auto& g : groups_) {
    if (g) g->hook.validate();
  }
}

bool WeightUpdateHooks::any() const {
  return std::any_of(groups_.begin(), groups_.end(), [](const auto& g) {
    return g && g->hook.kind() != WeightUpdateHookKind::kNone;
  });
}

double WeightUpdateHooks::weight_decay_of(size_t group, const torch::optim::OptimizerOptions& options) const {
  const auto& hook = *groups_[group];
  const double wd = hook.weight_decay_of ? hook.weight_decay_of(options) : hook.weight_decay;
  TORCH_CHECK_VALUE(wd == 0 || hook.decay, kWho, "param group ", group, ": weight_decay ", wd, ": ",
                    hook.decay_refusal);
  return wd;
}

void WeightUpdateHooks::check(torch::optim::Optimizer& optimizer) const {
  const auto& groups = optimizer.param_groups();
  TORCH_CHECK_VALUE(groups.size() == groups_.size(), kWho, "the optimizer has ", groups.size(),
                    " param groups but its hooks were made for ", groups_.size());
  for (const auto g : c10::irange(groups.size())) {
    if (groups_[g] && groups_[g]->hook.kind() != WeightUpdateHookKind::kNone) {
      weight_decay_of(g, groups[g].options());
    }
  }
}

void WeightUpdateHooks::before_step(torch::optim::Optimizer& optimizer) {
  kept_.clear();
  check(optimizer);
  const auto& groups = optimizer.param_groups();
  for (const auto g : c10::irange(groups.size())) {
    const auto& hook = groups_[g];
    if (!hook || hook->hook.kind() == WeightUpdateHookKind::kNone) continue;
    const double lr = groups[g].options().get_lr();
    const double wd = weight_decay_of(g, groups[g].options());
    for (const auto& p : groups[g].params()) {
      // Emerging-Optimizers' loop skips a parameter without a gradient; so
      // does every optimizer's step, and so do its hooks.
      if (!p.grad().defined()) continue;
      kept_.push_back({p, p.detach().clone(), &*hook, lr, wd});
    }
  }
}

// Per kept parameter, in double: p_wd = c·p_before (decayed as the
// optimizer decays it: the factor applied in the weight's dtype) and the
// step D = p_after − p_wd = −lr·U.
std::pair<at::Tensor, at::Tensor> WeightUpdateHooks::decayed_and_step(size_t i) const {
  const auto& k = kept_[i];
  auto before = k.before.clone();
  detail::scale_(before, decay_factor(k.group->decay, k.weight_decay, k.lr));
  auto decayed = before.to(at::kDouble);
  auto step = k.param.detach().to(at::kDouble, /*non_blocking=*/false, /*copy=*/true).sub_(decayed);
  return {std::move(decayed), std::move(step)};
}

// Row i: the square sums of (p_wd, D, p_after) of kept parameter i, summed
// over its parts.
at::Tensor WeightUpdateHooks::square_sums() const {
  const auto n = static_cast<int64_t>(kept_.size());
  std::vector<double> values;
  std::vector<at::Tensor> params;
  for (const auto i : c10::irange(kept_.size())) {
    const auto [decayed, step] = decayed_and_step(i);
    values.push_back(square_sum(decayed));
    values.push_back(square_sum(step));
    values.push_back(square_sum(decayed + step));
    params.push_back(kept_[i].param);
  }
  auto sums = at::tensor(values, at::kDouble).reshape({n, 3});
  if (sum_) sum_(params, sums);
  return sums;
}

void WeightUpdateHooks::after_step(torch::optim::Optimizer&) {
  if (kept_.empty()) return;
  const auto sums = square_sums();
  const auto s = sums.accessor<double, 2>();
  std::vector<size_t> projected;  // hyperball: the weights to put back on their sphere
  for (const auto i : c10::irange(kept_.size())) {
    auto& k = kept_[i];
    const auto& h = k.group->hook;
    const double eps = h.eps();
    const double pre = norm_or_zero(s[i][0], eps);
    // ‖U‖ = ‖D‖/lr; at lr 0 the update does not move p, whatever its scale.
    const double update = k.lr > 0 ? std::sqrt(s[i][1]) / k.lr : 0.0;
    auto [decayed, step] = decayed_and_step(i);
    at::Tensor result;
    if (h.kind() == WeightUpdateHookKind::kRadialBrake) {
      const double post = norm_or_zero(s[i][2], eps);
      const double delta = post - pre;
      const double scale = delta >= eps ? h.outward_scale() : (delta <= -eps ? h.inward_scale() : 0.0);
      const double projection = post < eps ? 0.0 : (pre + scale * delta) / std::max(post, eps);
      result = decayed.add_(step).mul_(projection);
    } else {
      // U ← scale·U, so p = p_wd − lr·scale·U = p_wd + scale·D.
      const bool hyperball = h.kind() == WeightUpdateHookKind::kHyperball;
      const bool zero = update < eps || (!hyperball && pre < eps);
      result = decayed.add_(step, zero ? 0.0 : (hyperball ? h.radius() : pre) / update);
      if (hyperball) projected.push_back(i);
    }
    k.param.detach().copy_(result);
  }
  project_to_radius(projected);
  kept_.clear();
}

// hyperball's second half: p ← R·p/‖p‖ (0 when ‖p‖ < eps).
void WeightUpdateHooks::project_to_radius(const std::vector<size_t>& which) const {
  if (which.empty()) return;
  std::vector<at::Tensor> params;
  std::vector<double> values;
  for (const auto i : which) {
    params.push_back(kept_[i].param);
    values.push_back(square_sum(params.back().detach().to(at::kDouble)));
  }
  auto norms = at::tensor(values, at::kDouble).reshape({static_cast<int64_t>(which.size()), 1});
  if (sum_) sum_(params, norms);
  const auto n = norms.accessor<double, 2>();
  for (const auto j : c10::irange(which.size())) {
    const auto& h = kept_[which[j]].group->hook;
    const double norm = std::sqrt(n[j][0]);
    auto p = params[j].detach();
    p.copy_(p.to(at::kDouble).mul(norm < h.eps() ? 0.0 : h.radius() / std::max(norm, h.eps())));
  }
}

}  // namespace muon
