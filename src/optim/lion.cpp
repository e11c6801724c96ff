// The Lion optimizer: options and the update (the rest is muon::ElementwiseOptimizer).
#include "muon/optim/lion.h"

#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <cmath>

#include "optim/elementwise_optimizer.h"

namespace muon {
namespace {

using detail::read_archived_double;
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

template struct ElementwiseParamState<LionParamState, 1>;
template class ElementwiseOptimizer<Lion, LionOptions, LionParamState>;

void Lion::update(at::Tensor& p, const at::Tensor& grad, LionParamState& st, const LionOptions& o) {
  st.step(st.step() + 1);
  auto& m = st.exp_avg();
  // u = sign(β1·m + (1 − β1)·g) = sign(m.lerp(g, 1 − β1)); m is read before it is updated.
  const auto u = m.lerp(grad, 1 - o.beta1()).sign_();
  if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
  p.add_(u, -o.lr());
  m.lerp_(grad, 1 - o.beta2());
}

}  // namespace muon
