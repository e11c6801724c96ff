// A step that happens whole or changes nothing (see step_transaction.h).
#include "optim/step_transaction.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <atomic>
#include <sstream>
#include <unordered_set>
#include <utility>
#include <vector>

#include "muon/compat.h"
#include "muon/optim/step_guard.h"
#include "muon/registry.h"
#include "util/names.h"

namespace muon {
namespace detail {

using torch::optim::Optimizer;

namespace {
std::atomic<bool> whole_steps_enabled{true};
}  // namespace

struct StepSnapshot::Leaf {
  // A tensor field of a state: where it is, the tensor it held, its values.
  struct Tensor {
    at::Tensor* where;
    at::Tensor held;
    at::Tensor copy;
  };
  struct Counter {
    int64_t* where;
    int64_t value;
  };
  Optimizer* optimizer = nullptr;
  std::vector<std::pair<at::Tensor, at::Tensor>> params;  // parameter, its values
  std::unordered_set<compat::StateKey> keys;              // states present before
  std::vector<Tensor> tensors;
  std::vector<Counter> counters;
  std::string archive;  // an optimizer no schema describes: its save()

  explicit Leaf(Optimizer& opt) : optimizer(&opt) {
    for (const auto& group : opt.param_groups()) {
      for (const auto& p : group.params()) {
        if (p.grad().defined()) params.emplace_back(p, p.detach().clone());
      }
    }
    for (const auto& item : opt.state()) keys.insert(item.first);
    const auto entry = OptimizerRegistry::global().state_entry_of(opt);
    if (entry == nullptr) {
      torch::serialize::OutputArchive out;
      opt.save(out);
      std::ostringstream bytes;
      out.save_to(bytes);
      archive = bytes.str();
      return;
    }
    for (const auto& item : opt.state()) {
      for (const auto& v : entry->state.values(*item.second)) {
        if (v.counter != nullptr) counters.push_back({v.counter, *v.counter});
        if (v.tensor == nullptr) continue;
        const auto& t = *v.tensor;
        tensors.push_back({v.tensor, t, t.defined() ? t.detach().clone() : at::Tensor()});
      }
    }
  }

  void restore() {
    at::NoGradGuard no_grad;
    for (auto& [p, copy] : params) p.detach().copy_(copy);
    if (!archive.empty()) {
      std::istringstream bytes(archive);
      torch::serialize::InputArchive in;
      in.load_from(bytes);
      optimizer->load(in);
      return;
    }
    auto& states = optimizer->state();
    for (auto it = states.begin(); it != states.end();) {
      it = keys.count(it->first) != 0 ? std::next(it) : states.erase(it);
    }
    for (auto& t : tensors) {
      if (t.held.defined()) t.held.detach().copy_(t.copy);
      *t.where = t.held;
    }
    for (auto& c : counters) *c.where = c.value;
  }
};

StepSnapshot::StepSnapshot(Optimizer& optimizer) {
  std::vector<Optimizer*> stack{&optimizer};
  while (!stack.empty()) {
    auto* opt = stack.back();
    stack.pop_back();
    if (auto* wrapper = dynamic_cast<InnerOptimizers*>(opt)) {
      for (size_t i = wrapper->num_inner(); i-- > 0;) {
        if (auto* inner = wrapper->inner_optimizer(i)) stack.push_back(inner);
      }
      continue;
    }
    leaves_.push_back(std::make_unique<Leaf>(*opt));
  }
}

StepSnapshot::~StepSnapshot() = default;

void StepSnapshot::restore() {
  for (auto& leaf : leaves_) leaf->restore();
}

void name_step_failure(const char* who, const std::function<std::string()>& where,
                       const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    message = clip(message.substr(0, message.find('\n')), 300);
    const std::string place = where ? where() : std::string();
    TORCH_CHECK_VALUE(false, who, "the step failed", place.empty() ? "" : " in ", place, ": ", message,
                      whole_steps() ? "; nothing of this step was applied"
                                    : "; parts of this step may be applied (muon::set_whole_steps is off)");
  }
}

void run_whole_step(Optimizer& optimizer, const char* who, const std::function<void()>& step,
                    const std::function<std::string()>& where) {
  if (!whole_steps()) {
    name_step_failure(who, where, step);
    return;
  }
  StepSnapshot snapshot(optimizer);
  try {
    name_step_failure(who, where, step);
  } catch (...) {
    snapshot.restore();
    throw;
  }
}

}  // namespace detail

void set_whole_steps(bool enabled) { detail::whole_steps_enabled.store(enabled); }

bool whole_steps() { return detail::whole_steps_enabled.load(); }

}  // namespace muon
