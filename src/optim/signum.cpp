// The Signum optimizer: options, state, step, save/load.
#include "muon/optim/signum.h"

#include <c10/util/Exception.h>

#include <array>
#include <cmath>
#include <memory>
#include <utility>

#include "muon/compat.h"
#include "optim/closure.h"
#include "optim/elementwise_optimizer.h"

namespace muon {
namespace {

using detail::read_archived_bool;
using detail::read_archived_double;
using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::Signum] ";

// One step of Signum on `p` (the header's formula; the order and the
// operations of Emerging-Optimizers' SingleMomentumOptimizer.step and
// calculate_signum_update: decay, then the momentum, then its sign).
void signum_update(at::Tensor& p, const at::Tensor& grad, SignumParamState& st,
                   const SignumOptions& o) {
  st.step(st.step() + 1);
  const auto t = static_cast<double>(st.step());
  const double beta = o.momentum();
  const auto g = detail::apply_weight_decay(p, grad, o.weight_decay_method(), o.lr(),
                                            o.weight_decay());
  auto& m = st.exp_avg();
  m.lerp_(g, 1 - beta);
  const double bias = o.correct_bias() ? 1 - std::pow(beta, t) : 1.0;
  if (o.nesterov()) {
    const double bias_next = o.correct_bias() ? 1 - std::pow(beta, t + 1) : 1.0;
    const auto u = (m * beta).div_(bias_next).add_(g * (1 - beta) / bias);
    p.add_(u.sign_(), -o.lr());
  } else {
    // m / (1 − β^t) has the sign of m: the divisor is positive.
    p.add_(m.sign(), -o.lr());
  }
}

}  // namespace

SignumOptions::SignumOptions(double lr) : lr_(lr) {}

void SignumOptions::validate() const {
  TORCH_CHECK_VALUE(std::isfinite(lr_) && lr_ >= 0, kWho, "lr must be >= 0, got ", lr_);
  TORCH_CHECK_VALUE(momentum_ >= 0 && momentum_ < 1, kWho, "momentum must be in [0, 1), got ",
                    momentum_);
  TORCH_CHECK_VALUE(std::isfinite(weight_decay_) && weight_decay_ >= 0, kWho,
                    "weight_decay must be >= 0, got ", weight_decay_);
  detail::check_weight_decay_method(kWho, weight_decay_method_);
}

void SignumOptions::serialize(OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr_));
  archive.write("momentum", c10::IValue(momentum_));
  archive.write("weight_decay", c10::IValue(weight_decay_));
  archive.write("weight_decay_method", c10::IValue(weight_decay_method_));
  archive.write("correct_bias", c10::IValue(correct_bias_));
  archive.write("nesterov", c10::IValue(nesterov_));
}

void SignumOptions::serialize(InputArchive& archive) {
  lr_ = read_archived_double(archive, "lr");
  momentum_ = read_archived_double(archive, "momentum");
  weight_decay_ = read_archived_double(archive, "weight_decay");
  weight_decay_method_ = detail::read_archived_string(archive, "weight_decay_method");
  correct_bias_ = read_archived_bool(archive, "correct_bias");
  nesterov_ = read_archived_bool(archive, "nesterov");
}

void SignumOptions::mix_settings(SettingsDigest& mix) const {
  mix(momentum_, weight_decay_, detail::weight_decay_method_code(weight_decay_method_),
      correct_bias_, nesterov_);
}

bool operator==(const SignumOptions& a, const SignumOptions& b) {
  return a.lr() == b.lr() && a.momentum() == b.momentum() &&
         a.weight_decay() == b.weight_decay() &&
         a.weight_decay_method() == b.weight_decay_method() &&
         a.correct_bias() == b.correct_bias() && a.nesterov() == b.nesterov();
}

double SignumOptions::get_lr() const { return lr(); }

void SignumOptions::set_lr(const double lr) { this->lr(lr); }

void SignumParamState::serialize(OutputArchive& archive) const {
  archive.write("step", c10::IValue(step_));
  detail::write_optional_buffer(archive, "exp_avg", exp_avg_);
}

void SignumParamState::serialize(InputArchive& archive) {
  step_ = detail::read_archived_int(archive, "step");
  exp_avg_ = detail::read_optional_buffer(archive, "exp_avg");
}

bool operator==(const SignumParamState& a, const SignumParamState& b) {
  return a.step() == b.step() && detail::same_buffer(a.exp_avg(), b.exp_avg());
}

Signum::Signum(std::vector<OptimizerParamGroup> param_groups, SignumOptions defaults)
    : Optimizer(param_groups, std::make_unique<SignumOptions>(defaults)) {
  defaults.validate();
  compat::reapply_group_options(*this, param_groups);
  check_before_step();
}

Signum::Signum(std::vector<at::Tensor> params, SignumOptions defaults)
    : Signum(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
             std::move(defaults)) {}

void Signum::check_before_step() {
  detail::check_group_options<SignumOptions>(param_groups_, kWho, "muon::SignumOptions");
}

at::Tensor Signum::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss = detail::loss_of(closure);
  // A scheduler or a direct edit may have changed options since: every group
  // is checked before any is stepped.
  if (!admit_step(param_groups_, kWho, [this] { check_before_step(); })) return loss;
  detail::for_each_stepped<SignumParamState, SignumOptions>(
      *this,
      [](const at::Tensor& p) {
        auto st = std::make_unique<SignumParamState>();
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        return st;
      },
      signum_update);
  return loss;
}

int64_t Signum::state_bytes() const {
  return detail::buffer_bytes<SignumParamState>(*this, [](const SignumParamState& s) {
    return std::array<const at::Tensor*, 1>{&s.exp_avg()};
  });
}

void Signum::save(OutputArchive& archive) const {
  detail::save_with_options<SignumParamState, SignumOptions>(*this, archive, "signum",
                                                             "muon::Signum");
}

void Signum::load(InputArchive& archive) {
  detail::load_with_options<SignumParamState, SignumOptions>(*this, archive, "signum", kWho,
                                                             "muon::Signum");
}

}  // namespace muon
