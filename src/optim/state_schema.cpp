// State schemas: the generic operations every state handler shares.
#include "muon/optim/state_schema.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "muon/scaling.h"

namespace muon {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;

StateSchema& StateSchema::add(StateField field) {
  TORCH_CHECK_VALUE(!field.name.empty(), "[muon::StateSchema] a field needs a name");
  TORCH_CHECK_VALUE(find(field.name) == nullptr, "[muon::StateSchema] field '", field.name,
                    "' is declared twice");
  const bool counter = field.shape == StateShape::kCounter;
  TORCH_CHECK_VALUE(counter ? field.counter != nullptr && field.tensor == nullptr
                            : field.tensor != nullptr && field.counter == nullptr,
                    "[muon::StateSchema] field '", field.name, "': a ",
                    counter ? "counter sets `counter`" : "tensor field sets `tensor`", " (only)");
  fields.push_back(std::move(field));
  return *this;
}

const StateField* StateSchema::find(const std::string& name) const {
  for (const auto& f : fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::vector<StateValue> StateSchema::values(OptimizerParamState& state) const {
  std::vector<StateValue> out;
  out.reserve(fields.size());
  for (const auto& f : fields) {
    out.push_back({&f, f.tensor ? f.tensor(state) : nullptr, f.counter ? f.counter(state) : nullptr});
  }
  return out;
}

bool StateSchema::present(const StateField& field, const Optimizer& optimizer, const OptimizerOptions& options) {
  return !field.present || field.present(optimizer, options);
}

bool StateSchema::held_here(const StateField& field, const Optimizer& optimizer, const at::Tensor& param) {
  return field.split != StateSplit::kOwner || !field.held || field.held(optimizer, param);
}

std::vector<int64_t> StateSchema::expected_shape(const StateField& field, const Optimizer& optimizer,
                                                 const at::Tensor& param) {
  switch (field.shape) {
    case StateShape::kCounter:
      return {};
    case StateShape::kParam:
      return param.sizes().vec();
    case StateShape::kRows:
      if (field.shape_of) return field.shape_of(optimizer, param.sizes());
      return {matrix_dims(param.sizes()).first, 1};
    case StateShape::kWhole:
      TORCH_CHECK_VALUE(field.whole_shape != nullptr, "[muon::StateSchema] field '", field.name,
                        "' of shape kWhole needs whole_shape");
      return field.whole_shape(optimizer, param);
  }
  return {};
}

at::ScalarType StateSchema::expected_dtype(const StateField& field, const at::Tensor& param) {
  if (field.shape == StateShape::kCounter) return at::kLong;
  if (field.dtype == StateDtype::kFloat32Wide) {
    return param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  }
  return param.scalar_type();
}

std::unique_ptr<OptimizerParamState> StateSchema::initial(const Optimizer& optimizer,
                                                          const OptimizerOptions& options,
                                                          const at::Tensor& param) const {
  auto state = make();
  complete(*state, optimizer, options, param);
  return state;
}

void StateSchema::complete(OptimizerParamState& state, const Optimizer& optimizer,
                           const OptimizerOptions& options, const at::Tensor& param) const {
  for (const auto& v : values(state)) {
    const auto& f = *v.field;
    if (f.init != StateInit::kZeros || !present(f, optimizer, options) || !held_here(f, optimizer, param)) continue;
    if (v.tensor != nullptr && !v.tensor->defined()) {
      *v.tensor = at::zeros(expected_shape(f, optimizer, param),
                            param.options().dtype(expected_dtype(f, param)));
    }
  }
}

void StateSchema::check(const StateField& field, const at::Tensor& value, const Optimizer& optimizer,
                        const at::Tensor& param, const std::string& who) {
  const auto shape = expected_shape(field, optimizer, param);
  const auto dtype = expected_dtype(field, param);
  const bool dtype_ok = value.scalar_type() == dtype ||
                        (field.dtype == StateDtype::kParam && value.scalar_type() == at::kFloat);
  TORCH_CHECK_VALUE(value.sizes() == at::IntArrayRef(shape) && dtype_ok, who, "'", field.name, "' is ",
                    value.scalar_type(), " of shape ", value.sizes(), "; ",
                    field.shape_note ? field.shape_note(optimizer) : std::string("this optimizer"), " keeps ",
                    dtype, " of shape ", at::IntArrayRef(shape), " for this parameter (shape ", param.sizes(), ")");
  TORCH_CHECK_VALUE(value.device() == param.device(), who, "'", field.name, "' is on ", value.device(),
                    ", the parameter on ", param.device());
}

int64_t StateSchema::bytes(OptimizerParamState& state) const {
  int64_t total = 0;
  for (const auto& v : values(state)) {
    if (v.tensor != nullptr && v.tensor->defined()) total += static_cast<int64_t>(v.tensor->nbytes());
  }
  return total;
}

std::string StateSchema::describe() const {
  std::ostringstream out;
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields[i];
    out << (i ? ", " : "") << f.name << " [";
    if (f.shape == StateShape::kCounter) {
      out << "counter]";
      continue;
    }
    out << (f.shape == StateShape::kParam ? "param" : f.shape == StateShape::kWhole ? "whole matrix" : "per row")
        << (f.dtype == StateDtype::kFloat32Wide ? " fp32" : "")
        << (f.init == StateInit::kZeros ? ", zeros" : ", on first use")
        << (f.split == StateSplit::kWithRows ? ", rows" : f.split == StateSplit::kOwner ? ", owner" : ", replicated")
        << (f.present ? ", optional" : "")
        << "]";
  }
  return out.str();
}

}  // namespace muon
