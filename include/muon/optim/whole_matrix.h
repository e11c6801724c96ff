#pragma once

/// The base of the optimizers that step each parameter as one whole matrix
/// (dim 0 × the product of the others; a 1-D parameter is a column) with
/// state of the whole matrix: muon::Soap, muon::KlSoap, muon::Dion,
/// muon::Iso and muon::Moso. It gives them torch::optim's constructors, the
/// step's checks (muon/optim/step_guard.h: options validated, parameters of
/// at least `Derived::kMinDims` dims, 2 unless Derived says 1), `state_bytes`, and `save`/`load` in LibTorch's
/// optimizer archive layout with the options beside it
/// (muon/optim/listed_fields.h). `Derived` names itself (`kNames`,
/// muon/optim/optimizer_names.h: e.g. {"muon::Dion", "dion"}) and steps its
/// parameters (`step_parameters`); the layouts override `whole_matrix_dims`
/// and `holds_whole_state` for row shards.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "muon/optim/listed_fields.h"
#include "muon/optim/optimizer_names.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"

namespace muon {

template <typename Derived, typename Options, typename State>
class WholeMatrixOptimizer : public torch::optim::Optimizer, public StateBytes, public StepGuard {
 public:
  /// The options of a group.
  using OptionsType = Options;
  /// The fewest dims a parameter may have (a derived class may say 1).
  static constexpr int64_t kMinDims = 2;

  /// Over `param_groups`; groups without options get `defaults`.
  explicit WholeMatrixOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                Options defaults = {});
  /// Over one group of `params`.
  explicit WholeMatrixOptimizer(std::vector<at::Tensor> params, Options defaults = {});

  /// One step on every parameter with a gradient; `closure`, if given, runs
  /// first with grad mode enabled and its loss is returned. The checks of
  /// muon/optim/step_guard.h run first.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Validates every group's options and parameters; raises c10::ValueError.
  void check_before_step() override;
  /// Writes options and state.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores what `save` wrote into an optimizer of the same kind and group
  /// structure (raises otherwise, changing nothing).
  void load(torch::serialize::InputArchive& archive) override;
  /// Bytes held in the state tensors.
  int64_t state_bytes() const override;

  /// The (rows, cols) of the whole matrix `param` is (a part of).
  virtual std::pair<int64_t, int64_t> whole_matrix_dims(const at::Tensor& param) const;
  /// Whether this process holds the whole-matrix state of `param` (every
  /// parameter here; the owner in the sharded layout).
  virtual bool holds_whole_state(const at::Tensor& param) const;

 protected:
  /// For layouts: builds the optimizer and checks it.
  WholeMatrixOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults, bool check);
  /// Steps every parameter with a gradient (after the step's checks).
  virtual void step_parameters() = 0;
};

}  // namespace muon
