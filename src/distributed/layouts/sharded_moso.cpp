// MOSO over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around MOSO's whole-matrix step (muon/distributed/layouts/sharded_moso.h).
#include "muon/distributed/layouts/sharded_moso.h"

#include <utility>

#include "distributed/layouts/sharded_internal.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedMoso] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedMoso::ShardedMoso(std::vector<OptimizerParamGroup> param_groups, MosoOptions defaults,
                         ShardedOptions options)
    : OwnerComputeOptimizer(std::move(param_groups), std::move(defaults), /*check=*/true) {
  attach(std::move(options), kWho, "moso", "MOSO state", "preconditions whole matrices");
}

ShardedMoso::ShardedMoso(std::vector<at::Tensor> params, std::vector<RowShard> shards, MosoOptions defaults,
                         ShardedOptions options)
    : ShardedMoso(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                  detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

void ShardedMoso::step_parameters() {
  detail::owner_compute_step<MosoParamState, MosoOptions>(
      *this, *strategy_,
      [](const at::Tensor&, const at::Tensor& grad, MosoParamState&, const MosoOptions&) { return grad; },
      // At each owner: MOSO's step on the whole gradient, as one process has it.
      [](const at::Tensor&, const at::Tensor& whole, MosoParamState& st, const MosoOptions& o) {
        return muon::detail::moso_matrix_update(whole, st, o);
      },
      // Every rank: weight decay and its rows of the update, as one process.
      [](at::Tensor& p, const at::Tensor& rows, const MosoOptions& o) {
        if (o.weight_decay() != 0) p.detach().add_(p.detach(), -o.lr() * o.weight_decay());
        p.detach().add_(rows.view(p.sizes()), -o.lr());
      });
}

}  // namespace muon::distributed
