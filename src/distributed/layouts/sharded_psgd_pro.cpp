// PSGD-Pro over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around PSGD-Pro's whole-matrix step (muon/distributed/layouts/sharded_psgd_pro.h).
#include "muon/distributed/layouts/sharded_psgd_pro.h"

#include "distributed/layouts/owner_compute_impl.h"
#include "distributed/layouts/sharded_internal.h"

namespace muon::distributed {

template class OwnerComputeOptimizer<PsgdPro, ShardedPsgdPro>;

void ShardedPsgdPro::step_parameters() {
  // At each owner: PSGD-Pro's step on the whole gradient (G + wd·p under l2), as one process has it.
  detail::owner_compute_gradient_step<PsgdProParamState, PsgdProOptions>(
      *this, *strategy_,
      [this](const at::Tensor& p, const at::Tensor& whole, PsgdProParamState& st, const PsgdProOptions& o) {
        return muon::detail::psgd_pro_update(detail::received_gradient(whole, whole_matrix_dims(p).second, o).second,
                                             st, o);
      });
}

}  // namespace muon::distributed
