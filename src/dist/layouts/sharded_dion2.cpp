// Dion2 over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around Dion2's whole-parameter step (muon/dist/layouts/sharded_dion2.h).
#include "muon/dist/layouts/sharded_dion2.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>

#include "muon/compat.h"

namespace muon::dist {
namespace {

constexpr const char* kWho = "[muon::dist::ShardedDion2] ";

using torch::optim::OptimizerParamGroup;

ShardedOptions with_shards(ShardedOptions options, const std::vector<at::Tensor>& params,
                           std::vector<RowShard> shards) {
  TORCH_CHECK_VALUE(shards.size() == params.size(), kWho, "got ", shards.size(),
                    " shard descriptions for ", params.size(), " parameters");
  for (const auto i : c10::irange(params.size())) options.shard(params[i], std::move(shards[i]));
  return options;
}

// What owner-compute Dion2 cannot step, refused before any collective: the
// replicated mode, parameters of fewer than 2 dims and tensor-parallel blocks.
void check_shards(const ShardedOptions& options, const char* algorithm) {
  TORCH_CHECK_VALUE(options.mode() == ShardedMode::kOwnerCompute, kWho, "optimizer '", algorithm,
                    "' runs in the sharded layout in mode owner_compute only, got '",
                    to_string(options.mode()), "' (each matrix's state lives with one owner)");
  for (const auto& [param, shard] : options.shards()) {
    (void)param;
    TORCH_CHECK_VALUE(shard.global_shape().size() >= 2, kWho, "a parameter has global shape ",
                      c10::IntArrayRef(shard.global_shape()), "; optimizer '", algorithm,
                      "' steps matrices (give 1-D parameters to the scalar optimizer)");
    TORCH_CHECK_VALUE(!shard.has_tensor_parallel(), kWho,
                      "a parameter is a tensor-parallel block (the 2-D layout); optimizer '",
                      algorithm, "' selects over whole matrices and does not run on them");
  }
}

}  // namespace

ShardedDion2::ShardedDion2(std::vector<OptimizerParamGroup> param_groups, Dion2Options defaults,
                           ShardedOptions options)
    : Dion2(std::move(param_groups), std::move(defaults), /*check=*/true) {
  check_shards(options, static_cast<const Dion2Options&>(this->defaults()).algorithm());
  for (const auto& [param, shard] : options.shards())
    global_shapes_[param.unsafeGetTensorImpl()] = shard.global_shape();
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedDion2::ShardedDion2(std::vector<at::Tensor> params, std::vector<RowShard> shards,
                           Dion2Options defaults, ShardedOptions options)
    : ShardedDion2(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)},
                   std::move(defaults),
                   with_shards(std::move(options), params, std::move(shards))) {}

std::vector<int64_t> ShardedDion2::whole_shape(const at::Tensor& param) const {
  const auto it = global_shapes_.find(param.unsafeGetTensorImpl());
  TORCH_CHECK_VALUE(it != global_shapes_.end(), kWho, "a parameter of shape ", param.sizes(),
                    " was not given to this optimizer");
  return it->second;
}

bool ShardedDion2::holds_whole_state(const at::Tensor& param) const {
  return strategy_->owns(param);
}

std::pair<int64_t, int64_t> ShardedDion2::max_over_processes(int64_t code) {
  return strategy_->max_over_processes(code);
}

void ShardedDion2::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  using Item = ShardedOrthogonalizer::OwnerComputeItem;
  auto& states = state();
  std::vector<Item> items;
  std::vector<const Dion2Options*> options;  // per item
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const Dion2Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<Dion2ParamState>();
      const auto shape = whole_shape(p);
      const int64_t cols = c10::multiply_integers(shape.begin() + 1, shape.end());
      items.push_back({p, p.grad().reshape({p.size(0), cols}), {}});
      options.push_back(&o);
    }
  }
  // At each owner: Dion2's step on the whole parameters, from the whole
  // gradient as one process has it.
  strategy_->owner_compute(
      items, [&](const std::vector<const Item*>& mine, const std::vector<at::Tensor>& wholes) {
        std::vector<at::Tensor> updates;
        for (const auto k : c10::irange(mine.size())) {
          const auto& o = *options[static_cast<size_t>(mine[k] - items.data())];
          auto& st = static_cast<Dion2ParamState&>(*states.at(compat::state_key(mine[k]->param)));
          const auto shape = whole_shape(mine[k]->param);
          const auto u = muon::detail::dion2_update(wholes[k].reshape(shape), st, o);
          updates.push_back(u.reshape(wholes[k].sizes()));
        }
        return updates;
      });
  // Every rank: weight decay and its rows of the update, as one process.
  for (const auto k : c10::irange(items.size())) {
    auto& p = items[k].param;
    const auto& o = *options[k];
    auto& st = static_cast<Dion2ParamState&>(*states.at(compat::state_key(p)));
    if (!holds_whole_state(p)) st.step(st.step() + 1);  // the owner's step counted it
    p.mul_(1 - o.lr() * o.weight_decay());
    p.add_(items[k].result.view(p.sizes()), -muon::detail::dion2_adjusted_lr(whole_shape(p), o));
  }
}

}  // namespace muon::dist
