// Dion over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around Dion's whole-matrix step (muon/distributed/layouts/sharded_dion.h).
#include "muon/distributed/layouts/sharded_dion.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <cmath>
#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "muon/compat.h"
#include "util/scale.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedDion] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedDion::ShardedDion(std::vector<OptimizerParamGroup> param_groups, DionOptions defaults,
                         ShardedOptions options)
    : Dion(std::move(param_groups), std::move(defaults), /*check=*/true) {
  detail::check_owner_compute_shards(options, param_groups_, kWho, "dion", "M and Q", "orthonormalizes whole matrices");
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedDion::ShardedDion(std::vector<at::Tensor> params, std::vector<RowShard> shards, DionOptions defaults,
                         ShardedOptions options)
    : ShardedDion(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                  detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

std::pair<int64_t, int64_t> ShardedDion::whole_matrix_dims(const at::Tensor& param) const {
  return strategy_->whole_matrix_dims(param);
}

bool ShardedDion::holds_whole_state(const at::Tensor& param) const { return strategy_->owns(param); }

std::pair<int64_t, int64_t> ShardedDion::max_over_processes(int64_t code) {
  return strategy_->max_over_processes(code);
}

void ShardedDion::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  using Item = ShardedOrthogonalizer::OwnerComputeItem;
  auto& states = state();
  std::vector<Item> items;
  std::vector<const DionOptions*> options;  // per item
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const DionOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<DionParamState>();
      items.push_back({p, p.grad().reshape({p.size(0), whole_matrix_dims(p).second}), {}});
      options.push_back(&o);
    }
  }
  // At each owner: Dion's step on the whole matrices, from the whole gradient as one process has it.
  strategy_->owner_compute(items, [&](const std::vector<const Item*>& mine, const std::vector<at::Tensor>& wholes) {
    std::vector<at::Tensor> updates;
    for (const auto k : c10::irange(mine.size())) {
      const auto& o = *options[static_cast<size_t>(mine[k] - items.data())];
      auto& st = static_cast<DionParamState&>(*states.at(compat::state_key(mine[k]->param)));
      updates.push_back(muon::detail::dion_matrix_update(wholes[k].contiguous(), st, o));
    }
    return updates;
  });
  // Every rank: its rows of the update, after weight decay on its rows, as one process.
  for (const auto k : c10::irange(items.size())) {
    auto& p = items[k].param;
    const auto& o = *options[k];
    auto& st = static_cast<DionParamState&>(*states.at(compat::state_key(p)));
    if (!holds_whole_state(p)) st.step(st.step() + 1);  // the owner's step counted it
    const auto [rows, cols] = whole_matrix_dims(p);
    muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
    p.add_(items[k].result.view(p.sizes()),
           -o.lr() * std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)));
  }
}

}  // namespace muon::distributed
