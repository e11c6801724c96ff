#pragma once

/// The base of the optimizers that step each parameter as one whole matrix
/// (dim 0 × the product of the others; a 1-D parameter is a column) with
/// state of the whole matrix: muon::Soap, muon::KlSoap, muon::Dion,
/// muon::Iso and muon::Moso. A muon::ListedOptimizer
/// (muon/optim/listed_optimizer.h: the step with the checks of
/// muon/optim/step_guard.h, `state_bytes`, and `save`/`load` in LibTorch's
/// optimizer archive layout with the options beside it), it gives them
/// torch::optim's constructors and the step's checks (options validated,
/// parameters of at least `Derived::kMinDims` dims, 2 unless Derived says
/// 1). `Derived` names itself (`kNames`,
/// muon/optim/optimizer_names.h: e.g. {"muon::Dion", "dion"}) and steps its
/// parameters (`step_parameters`); the layouts override `whole_matrix_dims`
/// and `holds_whole_state` for row shards. MUON_DEFINE_WHOLE_MATRIX(Iso,
/// "iso") declares such a class whole (below).
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "muon/optim/listed_fields.h"
#include "muon/optim/listed_optimizer.h"
#include "muon/optim/optimizer_names.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"

namespace muon {

template <typename Derived, typename Options, typename State>
class WholeMatrixOptimizer : public ListedOptimizer<Derived, Options, State> {
 public:
  /// The fewest dims a parameter may have (a derived class may say 1).
  static constexpr int64_t kMinDims = 2;

  /// Over `param_groups`; groups without options get `defaults`.
  explicit WholeMatrixOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                Options defaults = {});
  /// Over one group of `params`.
  explicit WholeMatrixOptimizer(std::vector<at::Tensor> params, Options defaults = {});

  /// Validates every group's options and parameters; raises c10::ValueError.
  void check_before_step() override;

  /// The (rows, cols) of the whole matrix `param` is (a part of).
  virtual std::pair<int64_t, int64_t> whole_matrix_dims(const at::Tensor& param) const;
  /// Whether this process holds the whole-matrix state of `param` (every
  /// parameter here; the owner in the sharded layout).
  virtual bool holds_whole_state(const at::Tensor& param) const;

 protected:
  /// For layouts: builds the optimizer and checks it.
  WholeMatrixOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults, bool check);
};

/// A whole-matrix optimizer declared whole: the class `Name`, a
/// WholeMatrixOptimizer over `Name##Options` and `Name##ParamState` with its
/// constructors, kNames {"muon::" #Name, prefix} (messages say
/// "[muon::Name] ...", archive keys "<prefix>_groups", "<prefix>_options/<i>",
/// ...), and `step_parameters`, which the library defines.
///
///   MUON_DEFINE_WHOLE_MATRIX(Iso, "iso");
#define MUON_DEFINE_WHOLE_MATRIX(Name, prefix)                                              \
  class Name : public ::muon::WholeMatrixOptimizer<Name, Name##Options, Name##ParamState> { \
   public:                                                                                  \
    using WholeMatrixOptimizer::WholeMatrixOptimizer;                                       \
    static constexpr ::muon::OptimizerNames kNames{"muon::" #Name, prefix};                 \
                                                                                            \
   protected:                                                                               \
    void step_parameters() override;                                                        \
  }

}  // namespace muon
