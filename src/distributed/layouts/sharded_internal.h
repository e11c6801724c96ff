// What the ShardedOrthogonalizer files (src/distributed/layouts/sharded*.cpp)
// and the sharded Dion2 and SOAP share: the prefix of their messages, the
// rows of a matrix a rank holds, the options from a list of shards. Internal.
#pragma once

#include <ATen/ATen.h>

#include <c10/util/irange.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

#include "muon/compat.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "optim/elementwise_optimizer.h"

namespace muon::distributed::detail {

inline constexpr const char* kShardedWho = "[muon::distributed::ShardedMuon] ";

/// Rows [offset, offset + count) of `matrix` (M × N), zero past row M.
at::Tensor rows_padded(const at::Tensor& matrix, int64_t offset, int64_t count);

/// `options` with shards[i] as the rows params[i] holds (the constructors
/// that take the two lists); raises c10::ValueError prefixed by `who` when
/// their lengths differ.
ShardedOptions with_shards(const char* who, ShardedOptions options, const std::vector<at::Tensor>& params,
                           std::vector<RowShard> shards);

/// What an owner-compute optimizer of whole matrices (ShardedSoap,
/// ShardedDion) cannot step, refused before any collective with messages
/// prefixed by `who`: a mode other than owner_compute, parameters of fewer
/// than 2 global dims, tensor-parallel blocks. `optimizer` is the registry
/// name; `state` says what one owner keeps, `needs` why whole matrices.
void check_owner_compute_shards(const ShardedOptions& options,
                                const std::vector<torch::optim::OptimizerParamGroup>& groups, const char* who,
                                const char* optimizer, const char* state, const char* needs);

/// One step of an owner-compute optimizer of whole matrices `opt` (State
/// its per-parameter state, Options its group options) over `strategy`:
/// each parameter with a gradient sends `payload(p, grad, options)` (rows ×
/// k: its gradient's rows, and whatever else the owner needs) to its owner;
/// the owner runs `compute(p, whole, state, options)` on the whole payload,
/// returning rows × n; each rank then runs `apply(p, rows, options)` on its
/// rows of that and counts the step of the parameters it does not own (the
/// owner's compute counted it).
template <typename State, typename Options, typename Opt, typename Payload, typename Compute, typename Apply>
void owner_compute_step(Opt& opt, ShardedOrthogonalizer& strategy, const Payload& payload, const Compute& compute,
                        const Apply& apply) {
  if (!opt.agreed_by_layout()) strategy.begin_step(opt.param_groups());
  using Item = ShardedOrthogonalizer::OwnerComputeItem;
  auto& states = opt.state();
  std::vector<Item> items;
  std::vector<const Options*> options;  // per item
  for (auto& group : opt.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<State>();
      const auto grad = p.grad().reshape({p.size(0), opt.whole_matrix_dims(p).second});
      items.push_back({p, payload(p, grad, static_cast<State&>(*slot), o), {}});
      options.push_back(&o);
    }
  }
  strategy.owner_compute(items, [&](const std::vector<const Item*>& mine, const std::vector<at::Tensor>& wholes) {
    std::vector<at::Tensor> results;
    for (const auto k : c10::irange(mine.size())) {
      const auto& o = *options[static_cast<size_t>(mine[k] - items.data())];
      auto& st = static_cast<State&>(*states.at(compat::state_key(mine[k]->param)));
      results.push_back(compute(mine[k]->param, wholes[k], st, o));
    }
    return results;
  });
  for (const auto k : c10::irange(items.size())) {
    auto& p = items[k].param;
    auto& st = static_cast<State&>(*states.at(compat::state_key(p)));
    if (!opt.holds_whole_state(p)) st.step(st.step() + 1);
    apply(p, items[k].result, *options[k]);
  }
}

// The owner-compute steps of optimizers whose `weight_decay_method` may be
// "l2" (the KL-SOAP family, PSGD-Pro): under l2 the owner's step sees
// G + wd·p, so the parameter's rows travel beside the gradient's.
template <typename Options>
bool l2_decay(const Options& o) {
  return o.weight_decay() != 0 && o.weight_decay_method() == "l2";
}

/// What a rank sends its owner: its rows of G, beside them of p under l2.
template <typename Options>
at::Tensor gradient_payload(const at::Tensor& p, const at::Tensor& grad, const Options& o) {
  return l2_decay(o) ? at::cat({grad, p.detach().reshape(grad.sizes())}, 1) : grad;
}

/// At the owner, from the whole payload of a matrix of `cols` columns: G,
/// and G + wd·p under l2 (G otherwise).
template <typename Options>
std::pair<at::Tensor, at::Tensor> received_gradient(const at::Tensor& whole, int64_t cols, const Options& o) {
  auto grad = whole.narrow(1, 0, cols).contiguous();
  auto inner = l2_decay(o) ? grad.add(whole.narrow(1, cols, cols).contiguous(), o.weight_decay()) : grad;
  return {std::move(grad), std::move(inner)};
}

/// Every rank: the weight decay (unless l2, which entered the owner's step)
/// and its rows of the update at the lr.
template <typename Options>
void apply_decay_and_rows(at::Tensor& p, const at::Tensor& rows, const Options& o) {
  if (o.weight_decay_method() != "l2") {
    muon::detail::apply_weight_decay(p, p.grad(), o.weight_decay_method(), o.lr(), o.weight_decay());
  }
  p.detach().add_(rows.view(p.sizes()), -o.lr());
}

/// The owner-compute step of an optimizer whose weight decay method may be
/// "l2" (the KL-SOAP family, PSGD-Pro): each rank sends gradient_payload,
/// each owner runs `at_owner(p, whole payload, state, options)`, every rank
/// applies apply_decay_and_rows.
template <typename State, typename Options, typename Opt, typename AtOwner>
void owner_compute_gradient_step(Opt& opt, ShardedOrthogonalizer& strategy, const AtOwner& at_owner) {
  owner_compute_step<State, Options>(
      opt, strategy,
      [](const at::Tensor& p, const at::Tensor& grad, State&, const Options& o) {
        return gradient_payload(p, grad, o);
      },
      at_owner, apply_decay_and_rows<Options>);
}

}  // namespace muon::distributed::detail
