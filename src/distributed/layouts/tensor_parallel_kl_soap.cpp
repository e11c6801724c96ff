// The KL-SOAP family over tensor-parallel blocks
// (muon/distributed/layouts/tensor_parallel_kl_soap.h).
#include "muon/distributed/layouts/tensor_parallel_kl_soap.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>
#include <vector>

#include "distributed/layouts/tensor_parallel_block.h"
#include "optim/elementwise_optimizer.h"
#include "optim/whole_matrix_optimizer.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::TensorParallelKlSoap] ";

bool l2(const KlSoapOptions& o) { return o.weight_decay() != 0 && o.weight_decay_method() == "l2"; }

}  // namespace

TensorParallelKlSoap::TensorParallelKlSoap(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                           KlSoapOptions defaults,
                                           std::unordered_map<const void*, TensorParallelShard> shards)
    : KlSoap(std::move(param_groups), std::move(defaults)), shards_(std::move(shards)) {
  detail::check_blocks(param_groups_, shards_, kWho);
}

std::pair<int64_t, int64_t> TensorParallelKlSoap::whole_matrix_dims(const at::Tensor& param) const {
  const auto it = shards_.find(param.unsafeGetTensorImpl());
  if (it == shards_.end()) return KlSoap::whole_matrix_dims(param);
  return {it->second.global_shape()[0], it->second.global_shape()[1]};
}

void TensorParallelKlSoap::step_parameters() {
  muon::detail::step_each_parameter<KlSoapParamState, KlSoapOptions>(
      *this, kWho,
      [this](const at::Tensor& p, KlSoapParamState& st, const KlSoapOptions& o) {
        const auto it = shards_.find(p.unsafeGetTensorImpl());
        if (it == shards_.end()) {
          const auto [rows, cols] = whole_matrix_dims(p);
          const auto grad = p.grad().reshape({rows, cols});
          const auto inner = l2(o) ? grad.add(p.detach().reshape({rows, cols}), o.weight_decay()) : grad;
          return muon::detail::kl_soap_update(grad, inner, p.sizes().slice(1), st, o);
        }
        const auto& s = it->second;
        const auto grad = detail::gather_blocks(p.grad(), s.partition_dim(), s.group());
        const auto inner =
            l2(o) ? grad.add(detail::gather_blocks(p.detach(), s.partition_dim(), s.group()), o.weight_decay()) : grad;
        const std::vector<int64_t> trailing{grad.size(1)};
        return detail::own_block(muon::detail::kl_soap_update(grad, inner, trailing, st, o), s).contiguous();
      },
      [](at::Tensor& p, const at::Tensor& u, const KlSoapOptions& o) {
        if (o.weight_decay_method() != "l2") {
          muon::detail::apply_weight_decay(p, p.grad(), o.weight_decay_method(), o.lr(), o.weight_decay());
        }
        p.detach().add_(u.view(p.sizes()), -o.lr());
      });
}

}  // namespace muon::distributed
