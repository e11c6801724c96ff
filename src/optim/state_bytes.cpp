// Bytes of optimizer state: the library's optimizers report their own,
// LibTorch's are counted from their per-parameter state.
#include "muon/optim/state_bytes.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <initializer_list>


namespace muon {
namespace {

using torch::optim::Optimizer;

int64_t bytes_of(std::initializer_list<const at::Tensor*> tensors) {
  int64_t bytes = 0;
  for (const auto* t : tensors) {
    if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

// Sum over the per-parameter states of `opt`, all of type State.
template <typename State, typename F>
int64_t sum_state(const Optimizer& opt, F&& bytes_of_state) {
  int64_t bytes = 0;
  for (const auto& item : opt.state()) bytes += bytes_of_state(static_cast<const State&>(*item.second));
  return bytes;
}

}  // namespace

int64_t optimizer_state_bytes(const Optimizer& opt) {
  using namespace torch::optim;  // NOLINT(google-build-using-namespace): local, many types
  if (const auto* own = dynamic_cast<const StateBytes*>(&opt)) return own->state_bytes();
  if (dynamic_cast<const AdamW*>(&opt) != nullptr) {
    return sum_state<AdamWParamState>(opt, [](const AdamWParamState& s) {
      return bytes_of({&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()});
    });
  }
  if (dynamic_cast<const Adam*>(&opt) != nullptr) {
    return sum_state<AdamParamState>(opt, [](const AdamParamState& s) {
      return bytes_of({&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()});
    });
  }
  if (dynamic_cast<const SGD*>(&opt) != nullptr) {
    return sum_state<SGDParamState>(
        opt, [](const SGDParamState& s) { return bytes_of({&s.momentum_buffer()}); });
  }
  if (dynamic_cast<const Adagrad*>(&opt) != nullptr) {
    return sum_state<AdagradParamState>(
        opt, [](const AdagradParamState& s) { return bytes_of({&s.sum()}); });
  }
  if (dynamic_cast<const RMSprop*>(&opt) != nullptr) {
    return sum_state<RMSpropParamState>(opt, [](const RMSpropParamState& s) {
      return bytes_of({&s.square_avg(), &s.momentum_buffer(), &s.grad_avg()});
    });
  }
  return 0;
}

}  // namespace muon
