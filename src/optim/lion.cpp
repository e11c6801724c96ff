// The Lion optimizer: options, state, step, save/load.
#include "muon/optim/lion.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <string>
#include <utility>

#include "muon/compat.h"
#include "optim/archive_kind.h"
#include "optim/closure.h"

namespace muon {
namespace {

using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::Lion] ";

double read_double(InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.toDouble();
}

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

void LionOptions::serialize(InputArchive& archive) {
  lr_ = read_double(archive, "lr");
  beta1_ = read_double(archive, "beta1");
  beta2_ = read_double(archive, "beta2");
  weight_decay_ = read_double(archive, "weight_decay");
}

bool operator==(const LionOptions& a, const LionOptions& b) {
  return a.lr() == b.lr() && a.beta1() == b.beta1() && a.beta2() == b.beta2() &&
         a.weight_decay() == b.weight_decay();
}

double LionOptions::get_lr() const { return lr(); }

void LionOptions::set_lr(const double lr) { this->lr(lr); }

void LionParamState::serialize(OutputArchive& archive) const {
  archive.write("step", c10::IValue(step_));
  if (exp_avg_.defined()) archive.write("exp_avg", exp_avg_, /*is_buffer=*/true);
}

void LionParamState::serialize(InputArchive& archive) {
  c10::IValue step;
  archive.read("step", step);
  step_ = step.toInt();
  at::Tensor buf;
  if (archive.try_read("exp_avg", buf, /*is_buffer=*/true)) exp_avg_ = buf;
}

bool operator==(const LionParamState& a, const LionParamState& b) {
  if (a.step() != b.step() || a.exp_avg().defined() != b.exp_avg().defined()) return false;
  return !a.exp_avg().defined() || at::equal(a.exp_avg(), b.exp_avg());
}

Lion::Lion(std::vector<OptimizerParamGroup> param_groups, LionOptions defaults)
    : Optimizer(param_groups, std::make_unique<LionOptions>(defaults)) {
  defaults.validate();
  compat::reapply_group_options(*this, param_groups);
  check_before_step();
}

void Lion::check_before_step() {
  for (const auto i : c10::irange(param_groups_.size())) {
    const auto* o = dynamic_cast<const LionOptions*>(&param_groups_[i].options());
    TORCH_CHECK_VALUE(o != nullptr, kWho, "param group ", i,
                      " has options of another optimizer; give it muon::LionOptions");
    o->validate();
  }
  detail::check_steppable(param_groups_, kWho);
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
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const LionOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = p.grad();
      auto& slot = state_[compat::state_key(p)];
      if (!slot) {
        auto st = std::make_unique<LionParamState>();
        st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<LionParamState&>(*slot);
      st.step(st.step() + 1);
      auto& m = st.exp_avg();
      // u = sign(β1·m + (1 − β1)·g) = sign(m.lerp(g, 1 − β1)); m is read before it is updated.
      const auto u = m.lerp(grad, 1 - o.beta1()).sign_();
      if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
      p.add_(u, -o.lr());
      m.lerp_(grad, 1 - o.beta2());
    }
  }
  return loss;
}

int64_t Lion::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& item : state_) {
    const auto& m = static_cast<const LionParamState&>(*item.second).exp_avg();
    if (m.defined()) bytes += static_cast<int64_t>(m.nbytes());
  }
  return bytes;
}

void Lion::save(OutputArchive& archive) const {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
  // LibTorch's generic loader restores state only; options go beside it.
  archive.write("lion_groups", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (const auto i : c10::irange(param_groups_.size())) {
    OutputArchive options(archive.compilation_unit());
    static_cast<const LionOptions&>(param_groups_[i].options()).serialize(options);
    archive.write("lion_options/" + std::to_string(i), options);
    archive.write("lion_group_size/" + std::to_string(i),
                  c10::IValue(static_cast<int64_t>(param_groups_[i].params().size())));
  }
}

void Lion::load(InputArchive& archive) {
  c10::IValue groups;
  TORCH_CHECK_VALUE(archive.try_read("lion_groups", groups), kWho, "the archive holds ",
                    detail::describe_archive(archive), "; this optimizer is muon::Lion");
  TORCH_CHECK_VALUE(groups.toInt() == static_cast<int64_t>(param_groups_.size()), kWho,
                    "the archive has ", groups.toInt(), " param groups, this optimizer has ",
                    param_groups_.size());
  std::vector<LionOptions> options(param_groups_.size());
  for (const auto i : c10::irange(param_groups_.size())) {
    InputArchive a;
    archive.read("lion_options/" + std::to_string(i), a);
    options[i].serialize(a);
    options[i].validate();
    c10::IValue size;
    archive.read("lion_group_size/" + std::to_string(i), size);
    TORCH_CHECK_VALUE(size.toInt() == static_cast<int64_t>(param_groups_[i].params().size()),
                      kWho, "param group ", i, " of the archive has ", size.toInt(),
                      " parameters, this optimizer's has ", param_groups_[i].params().size());
  }
  // Checked above: LibTorch's loader below cannot fail half-way on structure.
  state_.clear();
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
  for (const auto i : c10::irange(param_groups_.size())) {
    param_groups_[i].set_options(std::make_unique<LionOptions>(options[i]));
  }
}

}  // namespace muon
