// Warmup + linear/cosine decay learning-rate schedule.
#include "muon/schedule.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <cmath>

#include "util/names.h"

namespace muon {
namespace {
constexpr const char* kWho = "[muon::WarmupDecaySchedule] ";
constexpr detail::EnumName<DecayStyle> kDecayStyles[] = {{DecayStyle::kConstant, "constant"},
                                                        {DecayStyle::kLinear, "linear"},
                                                        {DecayStyle::kCosine, "cosine"}};
}  // namespace

MUON_DEFINE_ENUM_NAMES(DecayStyle, parse_decay_style, kDecayStyles, kWho, "decay style");

LrScheduleOptions& LrScheduleOptions::style(const std::string& name) {
  style_ = parse_decay_style(name);
  return *this;
}

void LrScheduleOptions::validate() const {
  TORCH_CHECK_VALUE(std::isfinite(lr_) && lr_ > 0, kWho, "lr must be > 0, got ", lr_);
  TORCH_CHECK_VALUE(min_lr_ >= 0 && min_lr_ <= lr_, kWho, "min_lr must be in [0, lr = ", lr_,
                    "], got ", min_lr_);
  TORCH_CHECK_VALUE(warmup_steps_ >= 0, kWho, "warmup_steps must be >= 0, got ", warmup_steps_);
  TORCH_CHECK_VALUE(warmup_init_ >= 0 && warmup_init_ <= lr_, kWho,
                    "warmup_init must be in [0, lr = ", lr_, "], got ", warmup_init_);
  TORCH_CHECK_VALUE(style_ == DecayStyle::kConstant || decay_steps_ > warmup_steps_, kWho,
                    "decay_steps must be > warmup_steps = ", warmup_steps_, " for ",
                    to_string(style_), " decay, got ", decay_steps_);
}

double lr_at(const LrScheduleOptions& o, int64_t step) {
  TORCH_CHECK_VALUE(step >= 0, kWho, "step must be >= 0, got ", step);
  const auto w = o.warmup_steps();
  if (step < w) {
    return o.warmup_init() +
           (o.lr() - o.warmup_init()) * static_cast<double>(step) / static_cast<double>(w);
  }
  if (o.style() == DecayStyle::kConstant) return o.lr();
  const auto d = o.decay_steps();
  if (step >= d) return o.min_lr();
  const double r = static_cast<double>(step - w) / static_cast<double>(d - w);
  const double span = o.lr() - o.min_lr();
  if (o.style() == DecayStyle::kLinear) return o.lr() - span * r;
  return o.min_lr() + span * 0.5 * (1.0 + std::cos(M_PI * r));
}

WarmupDecaySchedule::WarmupDecaySchedule(torch::optim::Optimizer& optimizer,
                                         LrScheduleOptions options)
    : optimizer_(optimizer), options_(options) {
  options_.validate();
  for (const auto& g : optimizer_.param_groups()) base_lrs_.push_back(g.options().get_lr());
  apply();
}

void WarmupDecaySchedule::step() {
  ++step_;
  apply();
}

void WarmupDecaySchedule::set_step(int64_t step) {
  TORCH_CHECK_VALUE(step >= 0, kWho, "step must be >= 0, got ", step);
  step_ = step;
  apply();
}

void WarmupDecaySchedule::apply() {
  auto& groups = optimizer_.param_groups();
  TORCH_CHECK_VALUE(groups.size() == base_lrs_.size(), kWho, "the optimizer has ", groups.size(),
                    " param groups, the schedule was created with ", base_lrs_.size());
  const double factor = lr_at(step_) / options_.lr();
  for (const auto i : c10::irange(groups.size())) groups[i].options().set_lr(base_lrs_[i] * factor);
}

}  // namespace muon
