// The KL-SOAP family over tensor-parallel blocks
// (muon/distributed/layouts/tensor_parallel_kl_soap.h).
#include "muon/distributed/layouts/tensor_parallel_kl_soap.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>
#include <vector>

#include "distributed/layouts/sharded_internal.h"
#include "distributed/layouts/tensor_parallel_block.h"
#include "optim/elementwise_optimizer.h"
#include "optim/whole_matrix_optimizer.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::TensorParallelKlSoap] ";

using detail::l2_decay;

}  // namespace

TensorParallelKlSoap::TensorParallelKlSoap(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                           KlSoapOptions defaults,
                                           std::unordered_map<const void*, TensorParallelShard> shards)
    : TensorParallelBlocks(std::move(param_groups), std::move(defaults), std::move(shards), kWho) {}

void TensorParallelKlSoap::step_parameters() {
  muon::detail::step_each_parameter<KlSoapParamState, KlSoapOptions>(
      *this, kWho,
      [this](const at::Tensor& p, KlSoapParamState& st, const KlSoapOptions& o) {
        const auto* s = shard_of(p);
        if (s == nullptr) {
          const auto [rows, cols] = whole_matrix_dims(p);
          const auto grad = p.grad().reshape({rows, cols});
          const auto inner = l2_decay(o) ? grad.add(p.detach().reshape({rows, cols}), o.weight_decay()) : grad;
          return muon::detail::kl_soap_update(grad, inner, p.sizes().slice(1), st, o);
        }
        const auto grad = detail::gather_blocks(p.grad(), s->partition_dim(), s->group());
        const auto inner =
            l2_decay(o) ? grad.add(detail::gather_blocks(p.detach(), s->partition_dim(), s->group()), o.weight_decay()) : grad;
        const std::vector<int64_t> trailing{grad.size(1)};
        return detail::own_block(muon::detail::kl_soap_update(grad, inner, trailing, st, o), *s).contiguous();
      },
      detail::apply_decay_and_rows<KlSoapOptions>);
}

}  // namespace muon::distributed
