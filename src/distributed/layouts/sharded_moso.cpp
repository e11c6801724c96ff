// MOSO over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around MOSO's whole-matrix step (muon/distributed/layouts/sharded_moso.h).
#include "muon/distributed/layouts/sharded_moso.h"

#include "distributed/layouts/owner_compute_impl.h"
#include "distributed/layouts/sharded_internal.h"

namespace muon::distributed {

template class OwnerComputeOptimizer<Moso, ShardedMoso>;

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
