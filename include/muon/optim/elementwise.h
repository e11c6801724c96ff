#pragma once

/// The skeleton of the library's element-wise optimizers (muon::Lion,
/// muon::LaProp, muon::Signum, muon::SimAdEMAMix): what they share apart
/// from their arithmetic.
///
/// `ElementwiseOptions<Self>` is a group's options: `Self` lists its fields
/// (`kFields`, their archive keys, and `fields(o)`, references to them) and
/// gets serialize, field-wise equality and get_lr/set_lr from the list; it
/// writes its own `validate` and `mix_settings`.
///
/// `ElementwiseParamState<Self, N>` is a state of a step counter and N
/// buffers of the parameter's shape; `Self` lists them (`kBuffers`, their
/// archive keys, and `buffers()`, pointers to them), and gets serialize,
/// clone and bit-equality from the list.
///
/// `ElementwiseOptimizer<Derived, Options, State>` is a
/// `torch::optim::Optimizer` whose step updates each parameter with a
/// gradient on its own. It owns the constructors (defaults validated, group
/// options checked), `step(closure)` with the checks of
/// muon/optim/step_guard.h, `save`/`load` with each group's options beside
/// LibTorch's state, and `state_bytes` over the buffers the state lists.
/// `Derived` supplies only:
///
///   static constexpr const char* kKind;    // "muon::Lion": messages say "[muon::Lion] ...",
///                                          // options "muon::LionOptions"; archive kind
///   static constexpr const char* kPrefix;  // "lion": archive keys "lion_groups", ...
///   static void update(at::Tensor& param, const at::Tensor& grad, State& state,
///                      const Options& options);  // one step on one parameter
///
/// and inherits the constructors (`using ElementwiseOptimizer::ElementwiseOptimizer;`).
/// The members are defined in the library (src/optim/elementwise_optimizer.h)
/// and instantiated there for each optimizer.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include "muon/optim/settings_digest.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"

namespace muon {

/// Options of an element-wise optimizer (per parameter group): the fields
/// `Self` lists as `static constexpr std::array<const char*, M> kFields`
/// (archive keys) and `template <typename O> static auto fields(O& o)`
/// (std::tie of o's fields in that order), `lr` among them.
template <typename Self>
struct ElementwiseOptions : public torch::optim::OptimizerCloneableOptions<Self>,
                            public DigestibleOptions {
  /// Reads every field written by the other overload.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes every field under its key.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Field-wise equality.
  friend bool operator==(const Self& lhs, const Self& rhs) {
    return Self::fields(lhs) == Self::fields(rhs);
  }
  /// `lr()`, for LR schedulers.
  double get_lr() const override { return static_cast<const Self&>(*this).lr(); }
  /// `lr(lr)`, for LR schedulers.
  void set_lr(double lr) override { static_cast<Self&>(*this).lr(lr); }
  ~ElementwiseOptions() override = default;
};

/// Per-parameter state of an element-wise optimizer: `step` and the N
/// buffers `Self` lists as `static constexpr std::array<const char*, N>
/// kBuffers` (archive keys) and `std::array<at::Tensor*, N> buffers()`.
template <typename Self, size_t N>
struct ElementwiseParamState : public torch::optim::OptimizerCloneableParamState<Self> {
  /// Steps taken on this parameter.
  TORCH_ARG(int64_t, step) = 0;

 public:
  /// Reads `step` and every buffer the archive holds (an absent one is left undefined).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes `step` and every defined buffer under its key.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The buffers, read-only.
  std::array<const at::Tensor*, N> const_buffers() const;
  /// Equal step and bit-equal buffers (both undefined, or equal).
  friend bool operator==(const Self& lhs, const Self& rhs) { return lhs.equals(rhs); }
  ~ElementwiseParamState() override = default;

 private:
  bool equals(const Self& other) const;
};

/// The optimizer skeleton (see the top of this header).
template <typename Derived, typename Options, typename State>
class ElementwiseOptimizer : public torch::optim::Optimizer, public StateBytes, public StepGuard {
 public:
  /// The optimizer over `param_groups`; groups without options get
  /// `defaults`. Raises c10::ValueError for invalid options or parameters.
  explicit ElementwiseOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                Options defaults = {});
  /// The optimizer over one group of `params`.
  explicit ElementwiseOptimizer(std::vector<at::Tensor> params, Options defaults = {});

  /// One step on every parameter with a gradient; `closure`, if given, runs
  /// first with grad mode enabled and its loss is returned. The checks of
  /// muon/optim/step_guard.h run first (options of every group, gradients,
  /// the non-finite policy); a failed check changes nothing.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Validates every group's options and parameters; raises c10::ValueError.
  void check_before_step() override;
  /// Writes options and state.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores options and state written by `save` into an optimizer of the
  /// same kind with the same group structure (raises c10::ValueError
  /// otherwise, changing nothing).
  void load(torch::serialize::InputArchive& archive) override;
  /// Bytes held in the state's buffers.
  int64_t state_bytes() const override;
};

}  // namespace muon
