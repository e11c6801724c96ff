// Which optimizers keep the per-parameter state of an optimizer, and the
// registry entries whose state schemas describe them.
#include <c10/util/Exception.h>

#include <typeinfo>

#include "muon/registry.h"

namespace muon {

using torch::optim::Optimizer;

std::shared_ptr<const OptimizerEntry> OptimizerRegistry::state_entry_of(const Optimizer& optimizer,
                                                                        const std::string& kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<const OptimizerEntry> found;
  for (const auto& e : entries_) {
    if (!e->state.declared() || !e->state.is_kind(optimizer)) continue;
    if (e->name == kind) return e;
    found = e;  // the last registered wins
  }
  return found;
}

namespace {

void collect(Optimizer& optimizer, const std::string& kind, const std::string& who,
             const OptimizerRegistry& registry, std::vector<StateHolder>& out) {
  if (auto* wrapper = dynamic_cast<InnerOptimizers*>(&optimizer)) {
    for (size_t i = 0; i < wrapper->num_inner(); ++i) {
      if (auto* inner = wrapper->inner_optimizer(i)) collect(*inner, wrapper->inner_kind(i), who, registry, out);
    }
    return;
  }
  auto entry = registry.state_entry_of(optimizer, kind);
  TORCH_CHECK_VALUE(entry != nullptr, who, "no registered optimizer describes the state of an optimizer of type ",
                    typeid(optimizer).name(), (kind.empty() ? "" : " (built as '" + kind.substr(0, 40) + "')"),
                    "; give its registry entry a state schema (OptimizerEntry::state, muon/optim/state_schema.h)");
  out.push_back({&optimizer, std::move(entry)});
}

}  // namespace

std::vector<StateHolder> state_holders(Optimizer& optimizer, const std::string& who,
                                       const OptimizerRegistry& registry) {
  std::vector<StateHolder> out;
  collect(optimizer, "", who, registry, out);
  return out;
}

}  // namespace muon
