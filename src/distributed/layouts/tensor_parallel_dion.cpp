// Dion over tensor-parallel blocks (muon/distributed/layouts/tensor_parallel_dion.h).
#include "muon/distributed/layouts/tensor_parallel_dion.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "distributed/layouts/dion_split.h"
#include "distributed/layouts/tensor_parallel_block.h"
#include "muon/compat.h"
#include "util/scale.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::TensorParallelDion] ";

}  // namespace

TensorParallelDion::TensorParallelDion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                       DionOptions defaults,
                                       std::unordered_map<const void*, TensorParallelShard> shards)
    : Dion(std::move(param_groups), std::move(defaults)), shards_(std::move(shards)) {
  detail::check_blocks(param_groups_, shards_, kWho);
}

std::pair<int64_t, int64_t> TensorParallelDion::whole_matrix_dims(const at::Tensor& param) const {
  const auto it = shards_.find(param.unsafeGetTensorImpl());
  if (it == shards_.end()) return Dion::whole_matrix_dims(param);
  return {it->second.global_shape()[0], it->second.global_shape()[1]};
}

void TensorParallelDion::step_parameters() {
  auto& states = state();
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const DionOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<DionParamState>();
      auto& st = static_cast<DionParamState&>(*slot);
      if (!st.momentum().defined()) st.momentum(at::zeros_like(p, at::MemoryFormat::Contiguous));
      const auto [rows, cols] = whole_matrix_dims(p);
      const auto it = shards_.find(p.unsafeGetTensorImpl());
      at::Tensor u;
      if (it == shards_.end()) {
        u = muon::detail::dion_matrix_update(p.grad().reshape({rows, cols}), st, o);
      } else {
        const auto& s = it->second;
        const auto dim = s.partition_dim();
        const auto sizes = balanced_split_sizes(s.global_shape()[static_cast<size_t>(dim)], s.group().size());
        const detail::DionSplit split{s.group(), rows, cols, /*split_cols=*/dim == 1,
                                      split_offset(sizes, s.group().rank()), p.size(dim)};
        // Q whole on every rank of the group, each drawing the same start.
        if (!st.Q().defined()) st.Q(muon::detail::dion_initial_q(rows, cols, o, p.options()));
        st.step(st.step() + 1);
        auto [block, q_new] = detail::dion_split_update(st.momentum(), p.grad(), st.Q(), st.step(), o, split);
        st.Q(std::move(q_new));
        u = std::move(block);
      }
      muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
      p.add_(u.view(p.sizes()), -o.lr() * std::sqrt(static_cast<double>(rows) / static_cast<double>(cols)));
    }
  }
}

}  // namespace muon::distributed
