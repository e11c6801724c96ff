// SOAP over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around SOAP's whole-matrix step (muon/distributed/layouts/sharded_soap.h).
#include "muon/distributed/layouts/sharded_soap.h"

#include "distributed/layouts/owner_compute_impl.h"
#include "distributed/layouts/sharded_internal.h"

namespace muon::distributed {
namespace {

bool l2(const SoapOptions& o) { return o.weight_decay() != 0 && o.weight_decay_method() == SoapWeightDecay::kL2; }

}  // namespace

template class OwnerComputeOptimizer<Soap, ShardedSoap>;

void ShardedSoap::step_parameters() {
  detail::owner_compute_step<SoapParamState, SoapOptions>(
      *this, *strategy_,
      // Under l2 the owner's Adam sees G + wd·p: the parameter's rows travel beside the gradient's.
      [](const at::Tensor& p, const at::Tensor& grad, SoapParamState&, const SoapOptions& o) {
        return l2(o) ? at::cat({grad, p.detach().reshape(grad.sizes())}, 1) : grad;
      },
      // At each owner: SOAP's step on the whole matrix, from the whole
      // gradient (and parameter) as one process has them.
      [this](const at::Tensor& p, const at::Tensor& whole, SoapParamState& st, const SoapOptions& o) {
        const int64_t cols = whole_matrix_dims(p).second;
        const auto grad = whole.narrow(1, 0, cols).contiguous();
        const auto adam_grad = l2(o) ? grad.add(whole.narrow(1, cols, cols).contiguous(), o.weight_decay()) : grad;
        return muon::detail::soap_matrix_update(grad, adam_grad, st, o, /*one_d=*/false);
      },
      // Every rank: its rows of the update, after weight decay on its rows, as one process.
      muon::detail::soap_apply_update);
}

}  // namespace muon::distributed
