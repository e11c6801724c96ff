// Optimizer state as checkpoints see it: slots, kinds, fields, read from the
// state schemas of the registry entries (muon/optim/state_schema.h).
#include "distributed/checkpoints/checkpoint_state.h"

#include <c10/util/Exception.h>

#include "muon/compat.h"

namespace muon::distributed::detail {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;

namespace {

const torch::optim::OptimizerOptions& options_of(const StateSlot& slot) {
  return slot.optimizer->param_groups()[slot.group].options();
}

}  // namespace

std::vector<StateSlot> state_slots(Optimizer& optimizer) {
  std::vector<StateSlot> out;
  for (auto& holder : state_holders(optimizer, "[muon::distributed::checkpoint] ")) {
    auto& groups = holder.optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const auto& p : groups[g].params()) out.push_back({holder.optimizer, p, g, holder.entry->name, holder.entry});
    }
  }
  return out;
}

OptimizerParamState* find_state(const StateSlot& slot) {
  auto& state = slot.optimizer->state();
  const auto it = state.find(compat::state_key(slot.param));
  return it == state.end() ? nullptr : it->second.get();
}

void ensure_state(const StateSlot& slot) {
  if (find_state(slot) != nullptr) return;
  const auto& schema = slot.entry->state;
  const auto& options = options_of(slot);
  bool eager = false;
  for (const auto& f : schema.fields) {
    eager = eager || (f.shape != StateShape::kCounter && f.init == StateInit::kZeros &&
                      StateSchema::present(f, *slot.optimizer, options));
  }
  if (eager) install_state(slot, schema.initial(*slot.optimizer, options, slot.param));
}

void complete_state(const StateSlot& slot, OptimizerParamState& state) {
  slot.entry->state.complete(state, *slot.optimizer, options_of(slot), slot.param);
}

std::unique_ptr<OptimizerParamState> empty_state(const StateSlot& slot) { return slot.entry->state.make(); }

std::vector<StateField> state_fields(const StateSlot& slot, OptimizerParamState& state) {
  std::vector<StateField> out;
  for (const auto& v : slot.entry->state.values(state)) {
    out.push_back({v.field->name, v.tensor, v.counter, v.field->split,
                   StateSchema::held_here(*v.field, *slot.optimizer, slot.param)});
  }
  return out;
}

void install_state(const StateSlot& slot, std::unique_ptr<OptimizerParamState> state) {
  slot.optimizer->state()[compat::state_key(slot.param)] = std::move(state);
}

}  // namespace muon::distributed::detail
