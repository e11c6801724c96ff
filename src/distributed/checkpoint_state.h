// The per-parameter optimizer state of every optimizer a checkpoint
// stores, seen one way: which inner optimizer steps each parameter, which
// kind of state it keeps, and that state's fields by name.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace muon::dist::detail {

/// One field of a parameter's state: a tensor or an integer, by name.
struct StateField {
  std::string name;
  at::Tensor* tensor = nullptr;
  int64_t* integer = nullptr;
};

/// A parameter stepped by an optimizer on this rank.
struct StateSlot {
  /// The innermost optimizer that steps it (a part of a composite, the
  /// inner optimizer of a layer-wise one).
  torch::optim::Optimizer* optimizer = nullptr;
  at::Tensor param;
  /// Index of its param group in `optimizer`.
  size_t group = 0;
  /// "muon", "adaptive_muon", "lion", "adam", "adamw" or "sgd".
  std::string kind;
};

/// Every parameter `optimizer` steps on this rank, descending into
/// composites (muon::CompositeOptimizer, MuonWithAdamW) and layer-wise
/// optimizers. Raises c10::ValueError naming an optimizer whose state
/// cannot be stored.
std::vector<StateSlot> state_slots(torch::optim::Optimizer& optimizer);

/// The slot's state, or nullptr when it has none.
torch::optim::OptimizerParamState* find_state(const StateSlot& slot);

/// Creates the state a first step would create (zeros, step 0) when the slot
/// has none and its kind's first step starts from zeros (all but sgd).
void ensure_state(const StateSlot& slot);

/// Completes a loaded state for the slot's options: an Adam or AdamW group
/// with amsgrad on and no max_exp_avg_sq (saved without amsgrad) gets zeros,
/// as a first step with amsgrad would start.
void complete_state(const StateSlot& slot, torch::optim::OptimizerParamState& state);

/// An empty state of `kind`, of the type its optimizer expects.
std::unique_ptr<torch::optim::OptimizerParamState> empty_state(const std::string& kind);

/// The fields of `state`, a state of `kind`, in a fixed order.
std::vector<StateField> state_fields(const std::string& kind, torch::optim::OptimizerParamState& state);

/// Installs `state` as the slot's state (replacing any).
void install_state(const StateSlot& slot, std::unique_ptr<torch::optim::OptimizerParamState> state);

}  // namespace muon::dist::detail
