// PSGD-Pro over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around PSGD-Pro's whole-matrix step (muon/distributed/layouts/sharded_psgd_pro.h).
#include "muon/distributed/layouts/sharded_psgd_pro.h"

#include <utility>

#include "distributed/layouts/sharded_internal.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedPsgdPro] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedPsgdPro::ShardedPsgdPro(std::vector<OptimizerParamGroup> param_groups, PsgdProOptions defaults,
                               ShardedOptions options)
    : OwnerComputeOptimizer(std::move(param_groups), std::move(defaults), /*check=*/true) {
  attach(std::move(options), kWho, "psgd_pro", "PSGD-Pro state", "preconditions whole matrices");
}

ShardedPsgdPro::ShardedPsgdPro(std::vector<at::Tensor> params, std::vector<RowShard> shards,
                               PsgdProOptions defaults, ShardedOptions options)
    : ShardedPsgdPro(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                     detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

void ShardedPsgdPro::step_parameters() {
  detail::owner_compute_step<PsgdProParamState, PsgdProOptions>(
      *this, *strategy_,
      [](const at::Tensor& p, const at::Tensor& grad, PsgdProParamState&, const PsgdProOptions& o) {
        return detail::gradient_payload(p, grad, o);
      },
      // At each owner: PSGD-Pro's step on the whole gradient (G + wd·p under l2), as one process has it.
      [this](const at::Tensor& p, const at::Tensor& whole, PsgdProParamState& st, const PsgdProOptions& o) {
        return muon::detail::psgd_pro_update(detail::received_gradient(whole, whole_matrix_dims(p).second, o).second,
                                             st, o);
      },
      detail::apply_decay_and_rows<PsgdProOptions>);
}

}  // namespace muon::distributed
