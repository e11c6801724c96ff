// MOSO over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around MOSO's whole-matrix step (muon/distributed/layouts/sharded_moso.h).
#include "muon/distributed/layouts/sharded_moso.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "muon/compat.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedMoso] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedMoso::ShardedMoso(std::vector<OptimizerParamGroup> param_groups, MosoOptions defaults,
                         ShardedOptions options)
    : Moso(std::move(param_groups), std::move(defaults), /*check=*/true) {
  detail::check_owner_compute_shards(options, param_groups_, kWho, "moso", "MOSO state",
                                     "preconditions whole matrices");
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedMoso::ShardedMoso(std::vector<at::Tensor> params, std::vector<RowShard> shards, MosoOptions defaults,
                         ShardedOptions options)
    : ShardedMoso(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                  detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

std::pair<int64_t, int64_t> ShardedMoso::whole_matrix_dims(const at::Tensor& param) const {
  return strategy_->whole_matrix_dims(param);
}

bool ShardedMoso::holds_whole_state(const at::Tensor& param) const { return strategy_->owns(param); }

std::pair<int64_t, int64_t> ShardedMoso::max_over_processes(int64_t code) {
  return strategy_->max_over_processes(code);
}

void ShardedMoso::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  using Item = ShardedOrthogonalizer::OwnerComputeItem;
  auto& states = state();
  std::vector<Item> items;
  std::vector<const MosoOptions*> options;  // per item
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const MosoOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<MosoParamState>();
      items.push_back({p, p.grad().reshape({p.size(0), whole_matrix_dims(p).second}), {}});
      options.push_back(&o);
    }
  }
  // At each owner: MOSO's step on the whole gradients, as one process has them.
  strategy_->owner_compute(items, [&](const std::vector<const Item*>& mine, const std::vector<at::Tensor>& wholes) {
    std::vector<at::Tensor> updates;
    for (const auto k : c10::irange(mine.size())) {
      const auto& o = *options[static_cast<size_t>(mine[k] - items.data())];
      auto& st = static_cast<MosoParamState&>(*states.at(compat::state_key(mine[k]->param)));
      updates.push_back(muon::detail::moso_matrix_update(wholes[k], st, o));
    }
    return updates;
  });
  // Every rank: weight decay and its rows of the update, as one process.
  for (const auto k : c10::irange(items.size())) {
    auto& p = items[k].param;
    const auto& o = *options[k];
    auto& st = static_cast<MosoParamState&>(*states.at(compat::state_key(p)));
    if (!holds_whole_state(p)) st.step(st.step() + 1);  // the owner's step counted it
    if (o.weight_decay() != 0) p.detach().add_(p.detach(), -o.lr() * o.weight_decay());
    p.detach().add_(items[k].result.view(p.sizes()), -o.lr());
  }
}

}  // namespace muon::distributed
