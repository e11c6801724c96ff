// PSGD-Pro over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around PSGD-Pro's whole-matrix step (muon/distributed/layouts/sharded_psgd_pro.h).
#include "muon/distributed/layouts/sharded_psgd_pro.h"

#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "optim/elementwise_optimizer.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedPsgdPro] ";

using torch::optim::OptimizerParamGroup;

bool l2(const PsgdProOptions& o) { return o.weight_decay() != 0 && o.weight_decay_method() == "l2"; }

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
      // Under l2 the owner's step sees G + wd·p: the parameter's rows travel beside the gradient's.
      [](const at::Tensor& p, const at::Tensor& grad, PsgdProParamState&, const PsgdProOptions& o) {
        return l2(o) ? at::cat({grad, p.detach().reshape(grad.sizes())}, 1) : grad;
      },
      // At each owner: PSGD-Pro's step on the whole gradient, as one process has it.
      [this](const at::Tensor& p, const at::Tensor& whole, PsgdProParamState& st, const PsgdProOptions& o) {
        const int64_t cols = whole_matrix_dims(p).second;
        const auto grad = whole.narrow(1, 0, cols).contiguous();
        return muon::detail::psgd_pro_update(
            l2(o) ? grad.add(whole.narrow(1, cols, cols).contiguous(), o.weight_decay()) : grad, st, o);
      },
      // Every rank: weight decay (l2 entered the owner's step) and its rows of the update.
      [](at::Tensor& p, const at::Tensor& rows, const PsgdProOptions& o) {
        if (o.weight_decay_method() != "l2") {
          muon::detail::apply_weight_decay(p, p.grad(), o.weight_decay_method(), o.lr(), o.weight_decay());
        }
        p.detach().add_(rows.view(p.sizes()), -o.lr());
      });
}

}  // namespace muon::distributed
