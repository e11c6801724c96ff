// Optimizer state as checkpoints see it: slots, kinds, fields.
#include "distributed/checkpoint_state.h"

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <typeinfo>

#include "muon/compat.h"
#include "muon/distributed/layerwise.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/composite.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"

namespace muon::dist::detail {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;

// The kind of a leaf optimizer ("" when it is none the checkpoint knows).
std::string kind_of(const Optimizer& opt) {
  if (dynamic_cast<const AdaptiveMuon*>(&opt) != nullptr) return "adaptive_muon";
  if (dynamic_cast<const Muon*>(&opt) != nullptr) return "muon";
  if (dynamic_cast<const Lion*>(&opt) != nullptr) return "lion";
  if (dynamic_cast<const torch::optim::AdamW*>(&opt) != nullptr) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&opt) != nullptr) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&opt) != nullptr) return "sgd";
  return "";
}

void collect(Optimizer& opt, std::vector<StateSlot>& out) {
  if (auto* composite = dynamic_cast<CompositeOptimizer*>(&opt)) {
    for (size_t i = 0; i < composite->num_parts(); ++i) collect(composite->part(i), out);
    return;
  }
  if (auto* layerwise = dynamic_cast<LayerwiseOptimizer*>(&opt)) {
    if (layerwise->inner() != nullptr) collect(*layerwise->inner(), out);
    return;
  }
  const auto kind = kind_of(opt);
  TORCH_CHECK_VALUE(!kind.empty(), "[muon::dist::checkpoint] cannot store the state of an optimizer of type ",
                    typeid(opt).name(),
                    "; checkpoints store muon, adaptive_muon, lion, adam, adamw and sgd, in "
                    "composites and layer-wise optimizers");
  auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) out.push_back({&opt, p, g, kind});
  }
}

at::Tensor zeros_of(const at::Tensor& p) { return at::zeros_like(p, at::MemoryFormat::Preserve); }

// Calls f(state as AdamW's or Adam's state type, whether the slot's group
// has amsgrad) for a slot of kind "adamw" or "adam".
template <typename F>
void with_adam(const StateSlot& slot, OptimizerParamState& state, F&& f) {
  const auto& options = slot.optimizer->param_groups()[slot.group].options();
  if (slot.kind == "adamw") {
    f(static_cast<torch::optim::AdamWParamState&>(state),
      static_cast<const torch::optim::AdamWOptions&>(options).amsgrad());
  } else {
    f(static_cast<torch::optim::AdamParamState&>(state),
      static_cast<const torch::optim::AdamOptions&>(options).amsgrad());
  }
}

}  // namespace

std::vector<StateSlot> state_slots(Optimizer& optimizer) {
  std::vector<StateSlot> out;
  collect(optimizer, out);
  return out;
}

OptimizerParamState* find_state(const StateSlot& slot) {
  auto& state = slot.optimizer->state();
  const auto it = state.find(compat::state_key(slot.param));
  return it == state.end() ? nullptr : it->second.get();
}

void ensure_state(const StateSlot& slot) {
  if (find_state(slot) != nullptr || slot.kind == "sgd") return;
  const auto& p = slot.param;
  auto state = empty_state(slot.kind);
  if (slot.kind == "muon" || slot.kind == "adaptive_muon") {
    // AdaptiveMuon's second moment is created at its first use, as a step does.
    static_cast<MuonParamState&>(*state).momentum_buffer(zeros_of(p));
  } else if (slot.kind == "lion") {
    static_cast<LionParamState&>(*state).exp_avg(zeros_of(p));
  } else {
    with_adam(slot, *state, [&](auto& st, bool amsgrad) {
      st.step(0);
      st.exp_avg(zeros_of(p));
      st.exp_avg_sq(zeros_of(p));
      if (amsgrad) st.max_exp_avg_sq(zeros_of(p));
    });
  }
  install_state(slot, std::move(state));
}

void complete_state(const StateSlot& slot, OptimizerParamState& state) {
  if (slot.kind != "adam" && slot.kind != "adamw") return;
  with_adam(slot, state, [](auto& st, bool amsgrad) {
    if (amsgrad && !st.max_exp_avg_sq().defined() && st.exp_avg_sq().defined()) {
      st.max_exp_avg_sq(at::zeros_like(st.exp_avg_sq()));
    }
  });
}

std::unique_ptr<OptimizerParamState> empty_state(const std::string& kind) {
  if (kind == "muon") return std::make_unique<MuonParamState>();
  if (kind == "adaptive_muon") return std::make_unique<AdaptiveMuonParamState>();
  if (kind == "lion") return std::make_unique<LionParamState>();
  if (kind == "adamw") return std::make_unique<torch::optim::AdamWParamState>();
  if (kind == "adam") return std::make_unique<torch::optim::AdamParamState>();
  TORCH_CHECK_VALUE(kind == "sgd", "[muon::dist::checkpoint] unknown state kind '", kind.substr(0, 40), "'");
  return std::make_unique<torch::optim::SGDParamState>();
}

std::vector<StateField> state_fields(const std::string& kind, OptimizerParamState& state) {
  auto tensor = [](const char* name, at::Tensor& t) { return StateField{name, &t, nullptr}; };
  auto integer = [](const char* name, int64_t& v) { return StateField{name, nullptr, &v}; };
  if (kind == "muon" || kind == "adaptive_muon") {
    auto& s = static_cast<MuonParamState&>(state);
    std::vector<StateField> out{integer("step", s.step()), tensor("momentum_buffer", s.momentum_buffer())};
    if (kind == "adaptive_muon") {
      out.push_back(tensor("second_moment", static_cast<AdaptiveMuonParamState&>(state).second_moment()));
    }
    return out;
  }
  if (kind == "lion") {
    auto& s = static_cast<LionParamState&>(state);
    return {integer("step", s.step()), tensor("exp_avg", s.exp_avg())};
  }
  auto adam = [&](auto& s) {
    return std::vector<StateField>{integer("step", s.step()), tensor("exp_avg", s.exp_avg()),
                                   tensor("exp_avg_sq", s.exp_avg_sq()),
                                   tensor("max_exp_avg_sq", s.max_exp_avg_sq())};
  };
  if (kind == "adamw") return adam(static_cast<torch::optim::AdamWParamState&>(state));
  if (kind == "adam") return adam(static_cast<torch::optim::AdamParamState&>(state));
  auto& s = static_cast<torch::optim::SGDParamState&>(state);
  return {tensor("momentum_buffer", s.momentum_buffer())};
}

void install_state(const StateSlot& slot, std::unique_ptr<OptimizerParamState> state) {
  slot.optimizer->state()[compat::state_key(slot.param)] = std::move(state);
}

}  // namespace muon::dist::detail
