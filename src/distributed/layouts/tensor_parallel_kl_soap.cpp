// The KL-SOAP family over tensor-parallel blocks
// (muon/distributed/layouts/tensor_parallel_kl_soap.h).
#include "muon/distributed/layouts/tensor_parallel_kl_soap.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>
#include <vector>

#include "optim/elementwise_optimizer.h"
#include "optim/whole_matrix_optimizer.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::TensorParallelKlSoap] ";

bool l2(const KlSoapOptions& o) { return o.weight_decay() != 0 && o.weight_decay_method() == "l2"; }

// The whole matrix of `block`, split along `dim` over `group` (uneven blocks).
at::Tensor gather_blocks(const at::Tensor& block, int64_t dim, const Group& group) {
  const auto parts = group.all_gather_uneven(block.contiguous().view({-1}));
  std::vector<at::Tensor> mats;
  const int64_t other = block.size(1 - dim);
  for (const auto& p : parts) mats.push_back(dim == 0 ? p.view({-1, other}) : p.view({other, -1}));
  return at::cat(mats, dim);
}

// This rank's block of `whole`, split along `dim` over `group` in balanced sizes.
at::Tensor own_block(const at::Tensor& whole, const TensorParallelShard& shard) {
  const auto dim = shard.partition_dim();
  const auto& group = shard.group();
  const auto sizes = balanced_split_sizes(whole.size(dim), group.size());
  return whole.narrow(dim, split_offset(sizes, group.rank()), sizes[static_cast<size_t>(group.rank())]);
}

}  // namespace

TensorParallelKlSoap::TensorParallelKlSoap(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                           KlSoapOptions defaults,
                                           std::unordered_map<const void*, TensorParallelShard> shards)
    : KlSoap(std::move(param_groups), std::move(defaults)), shards_(std::move(shards)) {
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      const auto it = shards_.find(p.unsafeGetTensorImpl());
      if (it == shards_.end()) continue;
      const auto& s = it->second;
      TORCH_CHECK_VALUE(p.dim() == 2 && s.global_shape().size() == 2, kWho, "a tensor-parallel block must be ",
                        "a 2-D block of a 2-D matrix; got a block of shape ", p.sizes(), " of ",
                        at::IntArrayRef(s.global_shape()));
      const auto d = s.partition_dim();
      const auto sizes = balanced_split_sizes(s.global_shape()[static_cast<size_t>(d)], s.group().size());
      TORCH_CHECK_VALUE(p.size(1 - d) == s.global_shape()[static_cast<size_t>(1 - d)] &&
                            p.size(d) == sizes[static_cast<size_t>(s.group().rank())],
                        kWho, "block of shape ", p.sizes(), " does not fit rank ", s.group().rank(), " of ",
                        s.group().size(), " of a ", at::IntArrayRef(s.global_shape()),
                        " matrix split along dim ", d);
    }
  }
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
        const auto grad = gather_blocks(p.grad(), s.partition_dim(), s.group());
        const auto inner =
            l2(o) ? grad.add(gather_blocks(p.detach(), s.partition_dim(), s.group()), o.weight_decay()) : grad;
        const std::vector<int64_t> trailing{grad.size(1)};
        return own_block(muon::detail::kl_soap_update(grad, inner, trailing, st, o), s).contiguous();
      },
      [](at::Tensor& p, const at::Tensor& u, const KlSoapOptions& o) {
        if (o.weight_decay_method() != "l2") {
          muon::detail::apply_weight_decay(p, p.grad(), o.weight_decay_method(), o.lr(), o.weight_decay());
        }
        p.detach().add_(u.view(p.sizes()), -o.lr());
      });
}

}  // namespace muon::distributed
