#pragma once

/// LibTorch version differences that the optimizers depend on, in one place.
///
///  - Optimizer state key: LibTorch 1.13 keys `Optimizer::state()` by a string
///    made from the parameter's TensorImpl pointer, 2.x by the pointer itself
///    (`void*`). `StateKey` is derived from the map with `decltype`, and
///    `state_key(p)` builds the key either way.
///  - `zero_grad`: 1.13 takes no argument and zeroes gradients in place; 2.x
///    takes `set_to_none` (default true). `zero_grad(optimizer, set_to_none)`
///    behaves the same on both.
///  - Per-group options: recent 2.x may replace the options of groups given to
///    a custom optimizer's base constructor; `reapply_group_options` puts the
///    caller's options back (a no-op where nothing was dropped).
#include <c10/util/StringUtil.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace muon::compat {

/// The map type of `torch::optim::Optimizer::state()`.
using StateMap =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

/// The key type of that map: std::string (1.13) or void* (2.x).
using StateKey = typename StateMap::key_type;

/// The state key LibTorch itself uses for parameter `p`.
template <typename Key = StateKey>
Key state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    // Same text as LibTorch's c10::guts::to_string(p.unsafeGetTensorImpl()):
    // both stream the pointer into an ostringstream.
    return c10::str(static_cast<const void*>(p.unsafeGetTensorImpl()));
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

namespace detail {
template <typename O, typename = void>
struct HasZeroGradBool : std::false_type {};
template <typename O>
struct HasZeroGradBool<O, std::void_t<decltype(std::declval<O&>().zero_grad(true))>>
    : std::true_type {};
}  // namespace detail

/// Clears the gradients of every parameter of `optimizer`: resets them to
/// undefined tensors when `set_to_none` (the 2.x default), zeroes them in
/// place otherwise, on any LibTorch version.
template <typename O>
void zero_grad(O& optimizer, bool set_to_none = true) {
  if constexpr (detail::HasZeroGradBool<O>::value) {
    optimizer.zero_grad(set_to_none);
  } else if (!set_to_none) {
    optimizer.zero_grad();
  } else {
    for (auto& group : optimizer.param_groups()) {
      for (auto& p : group.params()) {
        if (p.grad().defined()) p.mutable_grad() = at::Tensor();
      }
    }
  }
}

/// Gives group `i` of `optimizer` a copy of `given[i]`'s options wherever the
/// caller supplied some, so that per-group options survive base constructors
/// that drop them. Call at the end of a custom optimizer's constructor with
/// the groups it was given.
inline void reapply_group_options(torch::optim::Optimizer& optimizer,
                                  const std::vector<torch::optim::OptimizerParamGroup>& given) {
  auto& groups = optimizer.param_groups();
  TORCH_INTERNAL_ASSERT(groups.size() == given.size());
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i].has_options()) groups[i].set_options(given[i].options().clone());
  }
}

}  // namespace muon::compat
