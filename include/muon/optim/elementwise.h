#pragma once

/// The skeleton of the library's element-wise optimizers (muon::Lion,
/// muon::LaProp, muon::Signum, muon::SimAdEMAMix): what they share apart
/// from their arithmetic.
///
/// Their options and states are muon::ListedOptions and
/// muon::ListedParamState (muon/optim/listed_fields.h): each lists its
/// fields or buffers once and gets its archive form, equality and settings
/// digest from the list; the options write their own `validate`.
///
/// `ElementwiseOptimizer<Derived, Options, State>` is a muon::ListedOptimizer
/// (muon/optim/listed_optimizer.h: `step(closure)` with the checks of
/// muon/optim/step_guard.h, `save`/`load` with each group's options beside
/// LibTorch's state, `state_bytes` over the buffers the state lists) whose
/// step updates each parameter with a gradient on its own. It owns the
/// constructors (defaults validated, group options checked).
/// `Derived` supplies only:
///
///   static constexpr OptimizerNames kNames{"muon::Lion", "lion"};  // muon/optim/optimizer_names.h
///   static void update(at::Tensor& param, const at::Tensor& grad, State& state,
///                      const Options& options);  // one step on one parameter
///
/// and inherits the constructors (`using ElementwiseOptimizer::ElementwiseOptimizer;`).
/// MUON_DEFINE_ELEMENTWISE(Lion, "lion") declares such a class whole (below).
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

#include "muon/optim/listed_fields.h"
#include "muon/optim/listed_optimizer.h"
#include "muon/optim/optimizer_names.h"
#include "muon/optim/settings_digest.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"

namespace muon {

/// The options of an element-wise optimizer: muon::ListedOptions
/// (muon/optim/listed_fields.h), by the name these headers used first.
template <typename Self>
using ElementwiseOptions = ListedOptions<Self>;

/// The state of an element-wise optimizer: muon::ListedParamState.
template <typename Self, size_t N>
using ElementwiseParamState = ListedParamState<Self, N>;

/// The optimizer skeleton (see the top of this header).
template <typename Derived, typename Options, typename State>
class ElementwiseOptimizer : public ListedOptimizer<Derived, Options, State> {
 public:
  /// The optimizer over `param_groups`; groups without options get
  /// `defaults`. Raises c10::ValueError for invalid options or parameters.
  explicit ElementwiseOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                Options defaults = {});
  /// The optimizer over one group of `params`.
  explicit ElementwiseOptimizer(std::vector<at::Tensor> params, Options defaults = {});

  /// Validates every group's options; raises c10::ValueError.
  void check_before_step() override;

 protected:
  /// `Derived::update` on every parameter with a gradient, its state made
  /// (zero buffers of the parameter's shape) at its first step.
  void step_parameters() override;
};

/// An element-wise optimizer declared whole: the class `Name`, an
/// ElementwiseOptimizer over `Name##Options` and `Name##ParamState` with its
/// constructors, kNames {"muon::" #Name, prefix} (messages say
/// "[muon::Name] ...", archive keys "<prefix>_groups", "<prefix>_options/<i>",
/// ...), and `update`, its step on one parameter, which the library defines.
///
///   MUON_DEFINE_ELEMENTWISE(Lion, "lion");
#define MUON_DEFINE_ELEMENTWISE(Name, prefix)                                               \
  class Name : public ::muon::ElementwiseOptimizer<Name, Name##Options, Name##ParamState> { \
   public:                                                                                  \
    using ElementwiseOptimizer::ElementwiseOptimizer;                                       \
    static constexpr ::muon::OptimizerNames kNames{"muon::" #Name, prefix};                 \
    static void update(at::Tensor& param, const at::Tensor& grad, Name##ParamState& state,  \
                       const Name##Options& options);                                       \
  }

}  // namespace muon
