// Iso over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around Iso's whole-matrix step (muon/distributed/layouts/sharded_iso.h).
#include "muon/distributed/layouts/sharded_iso.h"

#include "distributed/layouts/owner_compute_impl.h"
#include "distributed/layouts/sharded_internal.h"

namespace muon::distributed {

template class OwnerComputeOptimizer<Iso, ShardedIso>;

void ShardedIso::step_parameters() {
  detail::owner_compute_step<IsoParamState, IsoOptions>(
      *this, *strategy_,
      // The first step factorizes the parameter: its rows travel beside the
      // gradient's (every rank counts the steps, so all agree on what they send).
      [](const at::Tensor& p, const at::Tensor& grad, IsoParamState& st, const IsoOptions&) {
        return st.step() == 0 ? at::cat({grad, p.detach().reshape(grad.sizes()).to(grad.scalar_type())}, 1) : grad;
      },
      // At each owner: Iso's step on the whole matrix.
      [this](const at::Tensor& p, const at::Tensor& whole, IsoParamState& st, const IsoOptions& o) {
        const int64_t cols = whole_matrix_dims(p).second;
        const auto grad = whole.narrow(1, 0, cols).contiguous();
        const auto param = whole.size(1) > cols ? whole.narrow(1, cols, cols).contiguous() : at::Tensor();
        return muon::detail::iso_matrix_update(param, grad, st, o);
      },
      // Every rank: its rows of the new matrix.
      [](at::Tensor& p, const at::Tensor& rows, const IsoOptions&) { p.detach().copy_(rows.view(p.sizes())); });
}

}  // namespace muon::distributed
