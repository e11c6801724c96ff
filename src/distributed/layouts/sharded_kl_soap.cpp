// The KL-SOAP family over row shards by owner-compute: ShardedOrthogonalizer's
// exchange around the family's whole-parameter step
// (muon/distributed/layouts/sharded_kl_soap.h).
#include "muon/distributed/layouts/sharded_kl_soap.h"

#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "optim/elementwise_optimizer.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedKlSoap] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedKlSoap::ShardedKlSoap(std::vector<OptimizerParamGroup> param_groups, KlSoapOptions defaults,
                             ShardedOptions options)
    : OwnerComputeOptimizer(std::move(param_groups), std::move(defaults), /*check=*/true) {
  attach(std::move(options), kWho, static_cast<const KlSoapOptions&>(this->defaults()).kind().c_str(),
         "KL-SOAP state", "preconditions whole matrices");
}

ShardedKlSoap::ShardedKlSoap(std::vector<at::Tensor> params, std::vector<RowShard> shards,
                             KlSoapOptions defaults, ShardedOptions options)
    : ShardedKlSoap(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                    detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

void ShardedKlSoap::step_parameters() {
  detail::owner_compute_step<KlSoapParamState, KlSoapOptions>(
      *this, *strategy_,
      [](const at::Tensor& p, const at::Tensor& grad, KlSoapParamState&, const KlSoapOptions& o) {
        return detail::gradient_payload(p, grad, o);
      },
      // At each owner: the family's step on the whole gradient (and parameter), as one process has them.
      [this](const at::Tensor& p, const at::Tensor& whole, KlSoapParamState& st, const KlSoapOptions& o) {
        const auto [grad, inner] = detail::received_gradient(whole, whole_matrix_dims(p).second, o);
        return muon::detail::kl_soap_update(grad, inner, p.sizes().slice(1), st, o);
      },
      detail::apply_decay_and_rows<KlSoapOptions>);
}

}  // namespace muon::distributed
