// Iso over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around Iso's whole-matrix step (muon/distributed/layouts/sharded_iso.h).
#include "muon/distributed/layouts/sharded_iso.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "muon/compat.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedIso] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedIso::ShardedIso(std::vector<OptimizerParamGroup> param_groups, IsoOptions defaults, ShardedOptions options)
    : Iso(std::move(param_groups), std::move(defaults), /*check=*/true) {
  detail::check_owner_compute_shards(options, param_groups_, kWho, "iso", "Iso state", "factorizes whole matrices");
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedIso::ShardedIso(std::vector<at::Tensor> params, std::vector<RowShard> shards, IsoOptions defaults,
                       ShardedOptions options)
    : ShardedIso(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                 detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

std::pair<int64_t, int64_t> ShardedIso::whole_matrix_dims(const at::Tensor& param) const {
  return strategy_->whole_matrix_dims(param);
}

bool ShardedIso::holds_whole_state(const at::Tensor& param) const { return strategy_->owns(param); }

std::pair<int64_t, int64_t> ShardedIso::max_over_processes(int64_t code) { return strategy_->max_over_processes(code); }

void ShardedIso::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  using Item = ShardedOrthogonalizer::OwnerComputeItem;
  auto& states = state();
  std::vector<Item> items;
  std::vector<const IsoOptions*> options;  // per item
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const IsoOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<IsoParamState>();
      const int64_t cols = whole_matrix_dims(p).second;
      const auto grad = p.grad().reshape({p.size(0), cols});
      // The first step factorizes the parameter: its rows travel beside the gradient's
      // (every rank counts the steps, so all agree on what they send).
      const bool first = static_cast<IsoParamState&>(*slot).step() == 0;
      items.push_back({p, first ? at::cat({grad, p.detach().reshape({p.size(0), cols}).to(grad.scalar_type())}, 1) : grad, {}});
      options.push_back(&o);
    }
  }
  // At each owner: Iso's step on the whole matrices.
  strategy_->owner_compute(items, [&](const std::vector<const Item*>& mine, const std::vector<at::Tensor>& wholes) {
    std::vector<at::Tensor> updates;
    for (const auto k : c10::irange(mine.size())) {
      const auto& o = *options[static_cast<size_t>(mine[k] - items.data())];
      auto& st = static_cast<IsoParamState&>(*states.at(compat::state_key(mine[k]->param)));
      const int64_t cols = whole_matrix_dims(mine[k]->param).second;
      const auto grad = wholes[k].narrow(1, 0, cols).contiguous();
      const auto param = wholes[k].size(1) > cols ? wholes[k].narrow(1, cols, cols).contiguous() : at::Tensor();
      updates.push_back(muon::detail::iso_matrix_update(param, grad, st, o));
    }
    return updates;
  });
  // Every rank: its rows of the new matrix.
  for (const auto k : c10::irange(items.size())) {
    auto& p = items[k].param;
    auto& st = static_cast<IsoParamState&>(*states.at(compat::state_key(p)));
    if (!holds_whole_state(p)) st.step(st.step() + 1);  // the owner's step counted it
    p.detach().copy_(items[k].result.view(p.sizes()));
  }
}

}  // namespace muon::distributed
