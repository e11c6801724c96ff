// What the library's element-wise optimizers (muon::Lion, muon::LaProp,
// muon::Signum, muon::SimAdEMAMix) share: the walk over the parameters a
// step updates, their options checks,
// Emerging-Optimizers' weight decay methods, and save/load in LibTorch's archive layout with each
// group's options written beside it under "<prefix>_groups", "<prefix>_options/<i>" and
// "<prefix>_group_size/<i>" (LibTorch's generic loader restores state
// only), and the definitions of muon::ListedOptimizer (muon/optim/listed_optimizer.h)
// and muon::ElementwiseOptimizer (muon/optim/elementwise.h), which each
// optimizer's source file instantiates. Internal.
#pragma once

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "muon/compat.h"
#include "muon/optim/elementwise.h"
#include "optim/listed_fields_impl.h"
#include "optim/option_checks.h"
#include "muon/optim/step_guard.h"
#include "optim/archive_kind.h"
#include "optim/closure.h"
#include "optim/step_transaction.h"
#include "util/fault_injection.h"

namespace muon::detail {

/// The weight decay methods of Emerging-Optimizers' WeightDecayMixin
/// (emerging_optimizers/mixin.py), in order: "decoupled", "independent", "l2".
inline const std::vector<std::string>& weight_decay_method_names() {
  static const std::vector<std::string> names = rule_choices(rule::weight_decay_method());
  return names;
}

/// The position of `method` in weight_decay_method_names(), or -1.
inline int weight_decay_method_code(const std::string& method) {
  const auto& names = weight_decay_method_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == method) return static_cast<int>(i);
  }
  return -1;
}

/// Weight decay `wd` by `method`, as Emerging-Optimizers' WeightDecayMixin
/// applies it before the update: "decoupled" p ← p − lr·wd·p and
/// "independent" p ← p − wd·p change `p` in place; "l2" leaves `p` and
/// returns grad + wd·p (a new tensor: the caller's gradient is not changed).
/// Returns the gradient the update uses (`grad` itself unless "l2").
inline at::Tensor apply_weight_decay(at::Tensor& p, const at::Tensor& grad,
                                     const std::string& method, double lr, double wd) {
  if (wd == 0) return grad;
  switch (weight_decay_method_code(method)) {
    case 0:
      p.add_(p, -(wd * lr));
      return grad;
    case 1:
      p.add_(p, -wd);
      return grad;
    case 2:
      return grad.add(p, wd);
    default:
      TORCH_INTERNAL_ASSERT(false, "unchecked weight_decay_method '", method, "'");
  }
  return grad;
}

/// v ← β2·v + (1 − β2)·g², Adam's second moment, without overflowing where
/// v itself is representable: g is scaled by √(1 − β2) before it is squared
/// (g² alone overflows fp32 from |g| ≈ 1.8e19), and no lerp forms inf − inf
/// once v is inf (it stays inf, never NaN).
inline void accumulate_second_moment(at::Tensor& v, const at::Tensor& g, double beta2) {
  const auto scaled = g.mul(std::sqrt(1 - beta2));
  v.mul_(beta2).addcmul_(scaled, scaled);
}

/// √(v / bias2) + eps as √v / √bias2 + eps: v / bias2 alone overflows where
/// √v does not (e.g. v = 1e37 at the first step, bias2 = 1e-3).
inline at::Tensor second_moment_denominator(const at::Tensor& v, double bias2, double eps) {
  return v.sqrt().div_(std::sqrt(bias2)).add_(eps);
}

/// Raises c10::ValueError "<who>..." unless every group's options are
/// `Options` (named `options_name` in the message) and valid, and every
/// parameter can be stepped in place (check_steppable).
template <typename Options>
void check_group_options(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                         const char* who, const char* options_name) {
  for (const auto i : c10::irange(groups.size())) {
    const auto* o = dynamic_cast<const Options*>(&groups[i].options());
    TORCH_CHECK_VALUE(o != nullptr, who, "param group ", i,
                      " has options of another optimizer; give it ", options_name);
    o->validate();
  }
  check_steppable(groups, who);
}

/// Writes `opt`'s state (LibTorch's layout), every group's options and size,
/// and `kind` (e.g. "muon::Lion") under "elementwise_kind", which
/// describe_archive names.
template <typename State, typename Options>
void save_with_options(const torch::optim::Optimizer& opt, torch::serialize::OutputArchive& archive,
                       const std::string& prefix, const char* kind) {
  torch::optim::serialize<State, Options>(archive, opt);
  archive.write("elementwise_kind", c10::IValue(std::string(kind)));
  const auto& groups = opt.param_groups();
  archive.write(prefix + "_groups", c10::IValue(static_cast<int64_t>(groups.size())));
  for (const auto i : c10::irange(groups.size())) {
    torch::serialize::OutputArchive options(archive.compilation_unit());
    static_cast<const Options&>(groups[i].options()).serialize(options);
    archive.write(prefix + "_options/" + std::to_string(i), options);
    archive.write(prefix + "_group_size/" + std::to_string(i),
                  c10::IValue(static_cast<int64_t>(groups[i].params().size())));
  }
}

/// Restores what save_with_options wrote into `opt` (named `kind`, e.g.
/// "muon::Lion", in messages). The structure and every group's options are
/// checked before anything changes: an archive of another optimizer or
/// another group structure raises c10::ValueError and leaves `opt` as it was.
template <typename State, typename Options>
void load_with_options(torch::optim::Optimizer& opt, torch::serialize::InputArchive& archive,
                       const std::string& prefix, const char* who, const char* kind) {
  auto& groups = opt.param_groups();
  c10::IValue count;
  TORCH_CHECK_VALUE(archive.try_read(prefix + "_groups", count), who, "the archive holds ",
                    describe_archive(archive), "; this optimizer is ", kind);
  TORCH_CHECK_VALUE(count.toInt() == static_cast<int64_t>(groups.size()), who, "the archive has ",
                    count.toInt(), " param groups, this optimizer has ", groups.size());
  std::vector<Options> options(groups.size());
  for (const auto i : c10::irange(groups.size())) {
    torch::serialize::InputArchive a;
    archive.read(prefix + "_options/" + std::to_string(i), a);
    options[i].serialize(a);
    options[i].validate();
    c10::IValue size;
    archive.read(prefix + "_group_size/" + std::to_string(i), size);
    TORCH_CHECK_VALUE(size.toInt() == static_cast<int64_t>(groups[i].params().size()), who,
                      "param group ", i, " of the archive has ", size.toInt(),
                      " parameters, this optimizer's has ", groups[i].params().size());
  }
  // Checked above: LibTorch's loader below cannot fail half-way on structure.
  opt.state().clear();
  torch::optim::serialize<State, Options>(archive, opt);
  for (const auto i : c10::irange(groups.size()))
    groups[i].set_options(std::make_unique<Options>(options[i]));
}

/// Calls `update(param, grad, state, options)` for every parameter of `opt`
/// with a gradient, in group order; a parameter's first call makes its
/// state with `make_state(param)` (a std::unique_ptr<State>).
template <typename State, typename Options, typename MakeState, typename Update>
void for_each_stepped(torch::optim::Optimizer& opt, MakeState make_state, Update update) {
  auto& states = opt.state();
  for (auto& group : opt.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = make_state(p);
      update(p, p.grad(), static_cast<State&>(*slot), options);
      fault_point("an element-wise update");
    }
  }
}

/// Bytes held in the tensors `buffers_of(state)` lists, over every state of `opt`.
template <typename State, typename Buffers>
int64_t buffer_bytes(const torch::optim::Optimizer& opt, Buffers buffers_of) {
  int64_t bytes = 0;
  for (const auto& item : opt.state()) {
    for (const at::Tensor* t : buffers_of(static_cast<const State&>(*item.second))) {
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
    }
  }
  return bytes;
}

}  // namespace muon::detail

namespace muon {

namespace detail {

/// "[<kind>] ", the prefix of `Derived`'s messages (e.g. "[muon::Lion] ").
template <typename Derived>
const char* who_of() {
  static const std::string who = std::string("[") + Derived::kNames.kind + "] ";
  return who.c_str();
}

/// "<kind>Options", the options type `Derived`'s messages name.
template <typename Derived>
const char* options_name_of() {
  static const std::string name = std::string(Derived::kNames.kind) + "Options";
  return name.c_str();
}

}  // namespace detail

template <typename Derived, typename Options, typename State>
ListedOptimizer<Derived, Options, State>::ListedOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                                          const Options& defaults)
    : Optimizer(param_groups, std::make_unique<Options>(defaults)) {
  defaults.validate();
  compat::reapply_group_options(*this, param_groups);
}

template <typename Derived, typename Options, typename State>
at::Tensor ListedOptimizer<Derived, Options, State>::step(LossClosure closure) {
  return guarded_step(
      *this, closure, detail::who_of<Derived>(), [this] { check_before_step(); }, [this] { step_parameters(); });
}

template <typename Derived, typename Options, typename State>
int64_t ListedOptimizer<Derived, Options, State>::state_bytes() const {
  return detail::buffer_bytes<State>(*this, [](const State& s) { return s.const_buffers(); });
}

template <typename Derived, typename Options, typename State>
void ListedOptimizer<Derived, Options, State>::save(torch::serialize::OutputArchive& archive) const {
  detail::save_with_options<State, Options>(*this, archive, Derived::kNames.prefix, Derived::kNames.kind);
}

template <typename Derived, typename Options, typename State>
void ListedOptimizer<Derived, Options, State>::load(torch::serialize::InputArchive& archive) {
  detail::load_with_options<State, Options>(*this, archive, Derived::kNames.prefix, detail::who_of<Derived>(),
                                            Derived::kNames.kind);
}

template <typename Derived, typename Options, typename State>
ElementwiseOptimizer<Derived, Options, State>::ElementwiseOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults)
    : ListedOptimizer<Derived, Options, State>(std::move(param_groups), defaults) {
  check_before_step();
}

template <typename Derived, typename Options, typename State>
ElementwiseOptimizer<Derived, Options, State>::ElementwiseOptimizer(std::vector<at::Tensor> params, Options defaults)
    : ElementwiseOptimizer(
          std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
          std::move(defaults)) {}

template <typename Derived, typename Options, typename State>
void ElementwiseOptimizer<Derived, Options, State>::check_before_step() {
  detail::check_group_options<Options>(this->param_groups_, detail::who_of<Derived>(),
                                       detail::options_name_of<Derived>());
}

template <typename Derived, typename Options, typename State>
void ElementwiseOptimizer<Derived, Options, State>::step_parameters() {
  detail::for_each_stepped<State, Options>(
      *this,
      [](const at::Tensor& p) {
        auto st = std::make_unique<State>();
        for (at::Tensor* buffer : st->buffers()) *buffer = at::zeros_like(p, at::MemoryFormat::Preserve);
        return st;
      },
      &Derived::update);
}

}  // namespace muon
