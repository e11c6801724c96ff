// Bytes of optimizer state: the library's optimizers report their own; any
// other is counted from its per-parameter state through the state schema of
// the registry entry that describes it.
#include "muon/optim/state_bytes.h"

#include "muon/registry.h"

namespace muon {

int64_t optimizer_state_bytes(const torch::optim::Optimizer& opt) {
  if (const auto* own = dynamic_cast<const StateBytes*>(&opt)) return own->state_bytes();
  const auto entry = OptimizerRegistry::global().state_entry_of(opt);
  if (entry == nullptr) return 0;
  int64_t bytes = 0;
  for (const auto& item : opt.state()) bytes += entry->state.bytes(*item.second);
  return bytes;
}

}  // namespace muon
