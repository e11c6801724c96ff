// The Lion optimizer: options, state, step, save/load.
#include "muon/optim/lion.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "muon/compat.h"
#include "optim/closure.h"
#include "optim/elementwise_optimizer.h"

namespace muon {
namespace {

using detail::read_archived_double;
using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::Lion] ";

}  // namespace

LionOptions::LionOptions(double lr) : lr_(lr) {}

void LionOptions::validate() const {
  TORCH_CHECK_VALUE(std::isfinite(lr_) && lr_ >= 0, kWho, "lr must be >= 0, got ", lr_);
  TORCH_CHECK_VALUE(beta1_ >= 0 && beta1_ < 1, kWho, "beta1 must be in [0, 1), got ", beta1_);
  TORCH_CHECK_VALUE(beta2_ >= 0 && beta2_ < 1, kWho, "beta2 must be in [0, 1), got ", beta2_);
  TORCH_CHECK_VALUE(std::isfinite(weight_decay_) && weight_decay_ >= 0, kWho,
                    "weight_decay must be >= 0, got ", weight_decay_);
}

void LionOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr_));
  archive.write("beta1", c10::IValue(beta1_));
  archive.write("beta2", c10::IValue(beta2_));
  archive.write("weight_decay", c10::IValue(weight_decay_));
}

void LionOptions::mix_settings(SettingsDigest& mix) const { mix(beta1_, beta2_, weight_decay_); }

void LionOptions::serialize(InputArchive& archive) {
  lr_ = read_archived_double(archive, "lr");
  beta1_ = read_archived_double(archive, "beta1");
  beta2_ = read_archived_double(archive, "beta2");
  weight_decay_ = read_archived_double(archive, "weight_decay");
}

bool operator==(const LionOptions& a, const LionOptions& b) {
  return a.lr() == b.lr() && a.beta1() == b.beta1() && a.beta2() == b.beta2() &&
         a.weight_decay() == b.weight_decay();
}

double LionOptions::get_lr() const { return lr(); }

void LionOptions::set_lr(const double lr) { this->lr(lr); }

void LionParamState::serialize(OutputArchive& archive) const {
  archive.write("step", c10::IValue(step_));
  detail::write_optional_buffer(archive, "exp_avg", exp_avg_);
}

void LionParamState::serialize(InputArchive& archive) {
  c10::IValue step;
  archive.read("step", step);
  step_ = step.toInt();
  exp_avg_ = detail::read_optional_buffer(archive, "exp_avg");
}

bool operator==(const LionParamState& a, const LionParamState& b) {
  return a.step() == b.step() && detail::same_buffer(a.exp_avg(), b.exp_avg());
}

Lion::Lion(std::vector<OptimizerParamGroup> param_groups, LionOptions defaults)
    : Optimizer(param_groups, std::make_unique<LionOptions>(defaults)) {
  defaults.validate();
  compat::reapply_group_options(*this, param_groups);
  check_before_step();
}

void Lion::check_before_step() {
  detail::check_group_options<LionOptions>(param_groups_, kWho, "muon::LionOptions");
}

Lion::Lion(std::vector<at::Tensor> params, LionOptions defaults)
    : Lion(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

at::Tensor Lion::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss = muon::detail::loss_of(closure);
  // A scheduler or a direct edit may have changed options since: every group
  // is checked before any is stepped.
  if (!admit_step(param_groups_, kWho, [this] { check_before_step(); })) return loss;
  detail::for_each_stepped<LionParamState, LionOptions>(
      *this,
      [](const at::Tensor& p) {
        auto st = std::make_unique<LionParamState>();
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        return st;
      },
      [](at::Tensor& p, const at::Tensor& grad, LionParamState& st, const LionOptions& o) {
        st.step(st.step() + 1);
        auto& m = st.exp_avg();
        // u = sign(β1·m + (1 − β1)·g) = sign(m.lerp(g, 1 − β1)); m is read before it is updated.
        const auto u = m.lerp(grad, 1 - o.beta1()).sign_();
        if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
        p.add_(u, -o.lr());
        m.lerp_(grad, 1 - o.beta2());
      });
  return loss;
}

int64_t Lion::state_bytes() const {
  return detail::buffer_bytes<LionParamState>(*this, [](const LionParamState& s) {
    return std::array<const at::Tensor*, 1>{&s.exp_avg()};
  });
}

void Lion::save(OutputArchive& archive) const {
  detail::save_with_options<LionParamState, LionOptions>(*this, archive, "lion", "muon::Lion");
}

void Lion::load(InputArchive& archive) {
  detail::load_with_options<LionParamState, LionOptions>(*this, archive, "lion", kWho,
                                                         "muon::Lion");
}

}  // namespace muon
