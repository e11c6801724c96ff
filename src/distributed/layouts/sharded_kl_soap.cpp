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

bool l2(const KlSoapOptions& o) { return o.weight_decay() != 0 && o.weight_decay_method() == "l2"; }

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
      // Under l2 the owner's inner step sees G + wd·p: the parameter's rows travel beside the gradient's.
      [](const at::Tensor& p, const at::Tensor& grad, KlSoapParamState&, const KlSoapOptions& o) {
        return l2(o) ? at::cat({grad, p.detach().reshape(grad.sizes())}, 1) : grad;
      },
      // At each owner: the family's step on the whole gradient (and parameter), as one process has them.
      [this](const at::Tensor& p, const at::Tensor& whole, KlSoapParamState& st, const KlSoapOptions& o) {
        const int64_t cols = whole_matrix_dims(p).second;
        const auto grad = whole.narrow(1, 0, cols).contiguous();
        const auto inner = l2(o) ? grad.add(whole.narrow(1, cols, cols).contiguous(), o.weight_decay()) : grad;
        return muon::detail::kl_soap_update(grad, inner, p.sizes().slice(1), st, o);
      },
      // Every rank: weight decay (l2 entered the owner's inner step) and its rows of the update.
      [](at::Tensor& p, const at::Tensor& rows, const KlSoapOptions& o) {
        if (o.weight_decay_method() != "l2") {
          muon::detail::apply_weight_decay(p, p.grad(), o.weight_decay_method(), o.lr(), o.weight_decay());
        }
        p.detach().add_(rows.view(p.sizes()), -o.lr());
      });
}

}  // namespace muon::distributed
