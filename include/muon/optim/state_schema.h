#pragma once

/// What an optimizer's per-parameter state is, declared once by its registry
/// entry (`OptimizerEntry::state`) and read by everything that handles state
/// without knowing the optimizer: checkpoints (save, reshard, load, eager
/// state), the Python package (`state[p]`, `state_dict`), state bytes and
/// `explain`.
///
/// A schema names each field, its shape and dtype relative to the parameter,
/// how it starts and how it splits when the parameter is split over ranks,
/// and how to reach it in the optimizer's `OptimizerParamState`:
///
///     auto s = muon::StateSchema::of<SignMomentumState>();
///     s.add(muon::StateField::counter_of<SignMomentumState>(
///         "step", [](SignMomentumState& st) -> int64_t& { return st.step; }));
///     s.add(muon::StateField::tensor_of<SignMomentumState>(
///         "momentum", [](SignMomentumState& st) -> at::Tensor& { return st.momentum; }));
///     s.is_kind = muon::StateSchema::is_a<SignMomentum>();
///     entry.state = s;  // OptimizerEntry
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace muon {

/// A field's shape relative to its parameter's.
enum class StateShape {
  kCounter,  ///< an int64 (e.g. `step`), one per parameter
  kParam,    ///< the parameter's shape
  kRows,     ///< the parameter's rows by 1 or by its columns (per-row statistics), set by the options
  kWhole,    ///< a shape of the whole matrix the parameter is (a part of), given by `whole_shape` (SOAP's factors)
};

/// A tensor field's dtype relative to its parameter's.
enum class StateDtype {
  kParam,        ///< the parameter's dtype
  kFloat32Wide,  ///< fp32, fp64 for an fp64 parameter
};

/// How a field starts.
enum class StateInit {
  kZeros,       ///< zeros (counters 0) before the first step; checkpoints create it eagerly
  kOnFirstUse,  ///< created by the step that first needs it; absent until then
};

/// How a field splits when its parameter is split over ranks.
enum class StateSplit {
  kWithRows,    ///< along dim 0 with the parameter: each rank keeps its rows
  kReplicated,  ///< whole and equal on every rank that steps the parameter
  kOwner,       ///< whole, held only by the rank that computes the whole matrix (`held` says which)
};

/// One field of a state (see the top of this header).
struct StateField {
  std::string name;
  StateShape shape = StateShape::kParam;
  StateDtype dtype = StateDtype::kParam;
  StateInit init = StateInit::kZeros;
  StateSplit split = StateSplit::kWithRows;
  /// The field in a state of the schema's type: a tensor field sets `tensor`,
  /// a counter `counter`.
  std::function<at::Tensor*(torch::optim::OptimizerParamState&)> tensor;
  std::function<int64_t*(torch::optim::OptimizerParamState&)> counter;
  /// Whether the field exists for a parameter of a group with `options`
  /// stepped by `optimizer` (Adam's max_exp_avg_sq: amsgrad). Empty: always.
  std::function<bool(const torch::optim::Optimizer& optimizer,
                     const torch::optim::OptimizerOptions& options)>
      present;
  /// kRows fields: the exact shape for a parameter of `param_shape` (e.g.
  /// rows × 1 or rows × cols by the optimizer's mode). Empty: rows × 1.
  std::function<std::vector<int64_t>(const torch::optim::Optimizer& optimizer, at::IntArrayRef param_shape)>
      shape_of;
  /// kRows fields: what sets the shape, for messages (e.g. "mode normuon"). Optional.
  std::function<std::string(const torch::optim::Optimizer& optimizer)> shape_note;
  /// kWhole fields: the exact shape for `param` (this process's tensor of
  /// it), which may depend on the whole matrix it is a part of.
  std::function<std::vector<int64_t>(const torch::optim::Optimizer& optimizer, const at::Tensor& param)>
      whole_shape;
  /// kOwner fields: whether this process holds the field of `param` (this
  /// process's tensor of it) in `optimizer`. Empty: every process does.
  std::function<bool(const torch::optim::Optimizer& optimizer, const at::Tensor& param)> held;

  /// A tensor field of state type S, reached by `get` (S& → at::Tensor&).
  template <typename S, typename Get>
  static StateField tensor_of(std::string name, Get get, StateInit init = StateInit::kZeros) {
    StateField f;
    f.name = std::move(name);
    f.init = init;
    f.tensor = [get](torch::optim::OptimizerParamState& st) { return &get(static_cast<S&>(st)); };
    return f;
  }
  /// A counter field of state type S, reached by `get` (S& → int64_t&).
  template <typename S, typename Get>
  static StateField counter_of(std::string name, Get get) {
    StateField f;
    f.name = std::move(name);
    f.shape = StateShape::kCounter;
    f.split = StateSplit::kReplicated;
    f.counter = [get](torch::optim::OptimizerParamState& st) { return &get(static_cast<S&>(st)); };
    return f;
  }
};

/// A field of one state: its declaration and where its value is.
struct StateValue {
  const StateField* field = nullptr;
  at::Tensor* tensor = nullptr;   ///< tensor fields
  int64_t* counter = nullptr;     ///< counter fields
};

/// The per-parameter state of one optimizer kind (see the top of this header).
struct StateSchema {
  /// A new, empty state of the type the optimizer keeps.
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>()> make;
  /// The fields, in a fixed order (checkpoints and Python list them so).
  std::vector<StateField> fields;
  /// Whether `optimizer` (built anywhere, e.g. by a layout's factory) keeps
  /// state of this kind. When several entries' schemas say yes, the one
  /// registered last wins (a subclass's entry follows its base's).
  std::function<bool(const torch::optim::Optimizer& optimizer)> is_kind;

  /// A schema whose states are S (default-constructible), with no fields yet.
  template <typename S>
  static StateSchema of() {
    StateSchema s;
    s.make = [] { return std::make_unique<S>(); };
    return s;
  }
  /// `is_kind` for optimizers that are (or derive from) O.
  template <typename O>
  static std::function<bool(const torch::optim::Optimizer&)> is_a() {
    return [](const torch::optim::Optimizer& opt) { return dynamic_cast<const O*>(&opt) != nullptr; };
  }
  /// Appends `field`; returns *this.
  StateSchema& add(StateField field);
  /// Whether the schema is declared (has `make` and `is_kind`).
  bool declared() const { return make != nullptr && is_kind != nullptr; }
  /// The field named `name`, or nullptr.
  const StateField* find(const std::string& name) const;

  /// The fields of `state` (a state of this schema), in order.
  std::vector<StateValue> values(torch::optim::OptimizerParamState& state) const;
  /// Whether `field` exists for a parameter of `options`' group in `optimizer`.
  static bool present(const StateField& field, const torch::optim::Optimizer& optimizer,
                      const torch::optim::OptimizerOptions& options);
  /// Whether this process holds `field` of `param` (a kOwner field only
  /// where its `held` says so; every other field everywhere).
  static bool held_here(const StateField& field, const torch::optim::Optimizer& optimizer, const at::Tensor& param);
  /// The state a first step starts from: kZeros fields that are present as
  /// zeros of their shape and dtype, counters 0.
  std::unique_ptr<torch::optim::OptimizerParamState> initial(
      const torch::optim::Optimizer& optimizer, const torch::optim::OptimizerOptions& options,
      const at::Tensor& param) const;
  /// Completes a loaded `state`: a present kZeros field it lacks (saved
  /// under other options, e.g. amsgrad off) becomes zeros, as a first step
  /// would start it.
  void complete(torch::optim::OptimizerParamState& state, const torch::optim::Optimizer& optimizer,
                const torch::optim::OptimizerOptions& options, const at::Tensor& param) const;
  /// The shape a tensor field keeps for `param` (a kRows field by `shape_of`, a kWhole one by `whole_shape`).
  static std::vector<int64_t> expected_shape(const StateField& field, const torch::optim::Optimizer& optimizer,
                                             const at::Tensor& param);
  /// The dtype a tensor field keeps for `param`.
  static at::ScalarType expected_dtype(const StateField& field, const at::Tensor& param);
  /// Raises c10::ValueError (naming `who`, the field, the shapes and dtypes)
  /// unless `value` has the shape, dtype and device the field keeps for
  /// `param` in `optimizer`. kParam-dtype fields may also be fp32 (a step
  /// in fp32 for a 16-bit parameter keeps them so).
  static void check(const StateField& field, const at::Tensor& value, const torch::optim::Optimizer& optimizer,
                    const at::Tensor& param, const std::string& who);
  /// Bytes of the tensors of `state`.
  int64_t bytes(torch::optim::OptimizerParamState& state) const;
  /// One line: each field with its shape, init and split ("momentum_buffer
  /// [param, zeros, rows], step [counter]").
  std::string describe() const;
};

/// Implemented by optimizers that step their parameters through inner
/// optimizers (muon::CompositeOptimizer, muon::distributed::LayerwiseOptimizer):
/// the state lives in the inner ones.
class InnerOptimizers {
 public:
  virtual ~InnerOptimizers() = default;
  /// Number of inner optimizers.
  virtual size_t num_inner() const = 0;
  /// Inner optimizer `i` (nullptr when this process has none).
  virtual torch::optim::Optimizer* inner_optimizer(size_t i) = 0;
  /// The registry name inner `i` was built from, or "" when not known.
  virtual std::string inner_kind(size_t i) const = 0;

 protected:
  InnerOptimizers() = default;
  InnerOptimizers(const InnerOptimizers&) = default;
  InnerOptimizers& operator=(const InnerOptimizers&) = default;
};

}  // namespace muon
