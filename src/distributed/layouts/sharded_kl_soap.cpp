// The KL-SOAP family over row shards by owner-compute: ShardedOrthogonalizer's
// exchange around the family's whole-parameter step
// (muon/distributed/layouts/sharded_kl_soap.h).
#include "muon/distributed/layouts/sharded_kl_soap.h"

#include "distributed/layouts/owner_compute_impl.h"
#include "distributed/layouts/sharded_internal.h"
#include "optim/elementwise_optimizer.h"

namespace muon::distributed {

template class OwnerComputeOptimizer<KlSoap, ShardedKlSoap>;

void ShardedKlSoap::step_parameters() {
  // At each owner: the family's step on the whole gradient (and parameter), as one process has them.
  detail::owner_compute_gradient_step<KlSoapParamState, KlSoapOptions>(
      *this, *strategy_,
      [this](const at::Tensor& p, const at::Tensor& whole, KlSoapParamState& st, const KlSoapOptions& o) {
        const auto [grad, inner] = detail::received_gradient(whole, whole_matrix_dims(p).second, o);
        return muon::detail::kl_soap_update(grad, inner, p.sizes().slice(1), st, o);
      });
}

}  // namespace muon::distributed
