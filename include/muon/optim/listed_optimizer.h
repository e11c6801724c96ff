#pragma once

/// What the two optimizer skeletons share, muon::ElementwiseOptimizer
/// (muon/optim/elementwise.h) and muon::WholeMatrixOptimizer
/// (muon/optim/whole_matrix.h): a `torch::optim::Optimizer` whose group
/// options are `Options` (a muon::ListedOptions) and whose per-parameter
/// state is `State` (a muon::ListedParamState). It owns the step with the
/// checks of muon/optim/step_guard.h (`check_before_step`, then
/// `step_parameters`), `save`/`load` in LibTorch's optimizer archive layout
/// with each group's options beside it under the keys of `Derived::kNames`
/// (muon/optim/optimizer_names.h), and `state_bytes` over the buffers the
/// state lists. A skeleton supplies the constructors, `check_before_step`
/// and `step_parameters`.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <vector>

#include "muon/optim/listed_fields.h"
#include "muon/optim/optimizer_names.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"

namespace muon {

template <typename Derived, typename Options, typename State>
class ListedOptimizer : public torch::optim::Optimizer, public StateBytes, public StepGuard {
 public:
  /// The options of a group.
  using OptionsType = Options;

  /// One step on every parameter with a gradient; `closure`, if given, runs
  /// first with grad mode enabled and its loss is returned. The checks of
  /// muon/optim/step_guard.h run first (options of every group, parameters,
  /// gradients, the non-finite policy); a failed check changes nothing.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Writes options and state.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores what `save` wrote into an optimizer of the same kind and group
  /// structure (raises c10::ValueError otherwise, changing nothing).
  void load(torch::serialize::InputArchive& archive) override;
  /// Bytes held in the state's buffers.
  int64_t state_bytes() const override;

 protected:
  /// Over `param_groups`; groups without options get `defaults`, which are
  /// validated (c10::ValueError).
  ListedOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, const Options& defaults);
  /// Steps every parameter with a gradient (after the step's checks).
  virtual void step_parameters() = 0;
};

}  // namespace muon
