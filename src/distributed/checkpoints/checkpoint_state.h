// The per-parameter optimizer state of every optimizer a checkpoint
// stores, seen one way: which inner optimizer steps each parameter, the
// registry entry whose state schema describes its state, and that state's
// fields by name.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "muon/registry.h"

namespace muon::distributed::detail {

/// One field of a parameter's state: its declaration and its value.
struct StateField {
  std::string name;
  at::Tensor* tensor = nullptr;
  int64_t* integer = nullptr;
  /// How it splits with the parameter (muon/optim/state_schema.h).
  StateSplit split = StateSplit::kWithRows;
  /// Whether this rank holds it (a kOwner field only on its owner).
  bool held = true;
};

/// A parameter stepped by an optimizer on this rank.
struct StateSlot {
  /// The innermost optimizer that steps it (a part of a composite, the
  /// inner optimizer of a layer-wise one).
  torch::optim::Optimizer* optimizer = nullptr;
  at::Tensor param;
  /// Index of its param group in `optimizer`.
  size_t group = 0;
  /// The registry name of the entry that describes its state.
  std::string kind;
  /// That entry (its `state` schema).
  std::shared_ptr<const OptimizerEntry> entry;
};

/// Every parameter `optimizer` steps on this rank, descending into
/// composites and layer-wise optimizers (muon::state_holders). Raises
/// c10::ValueError naming an optimizer no registered schema describes.
std::vector<StateSlot> state_slots(torch::optim::Optimizer& optimizer);

/// The slot's state, or nullptr when it has none.
torch::optim::OptimizerParamState* find_state(const StateSlot& slot);

/// Creates the state a first step starts from (its schema's zeros fields,
/// counters 0) when the slot has none and its schema has a zeros field
/// present under the slot's options (SGD's momentum is made by its step).
void ensure_state(const StateSlot& slot);

/// Completes a loaded state for the slot's options (a zeros field it lacks
/// becomes zeros: Adam's max_exp_avg_sq saved without amsgrad).
void complete_state(const StateSlot& slot, torch::optim::OptimizerParamState& state);

/// An empty state of the type the slot's optimizer keeps.
std::unique_ptr<torch::optim::OptimizerParamState> empty_state(const StateSlot& slot);

/// The fields of `state` (a state of the slot's kind), in the schema's order.
std::vector<StateField> state_fields(const StateSlot& slot, torch::optim::OptimizerParamState& state);

/// Installs `state` as the slot's state (replacing any).
void install_state(const StateSlot& slot, std::unique_ptr<torch::optim::OptimizerParamState> state);

}  // namespace muon::distributed::detail
