// Dion over tensor-parallel blocks (muon/distributed/layouts/tensor_parallel_dion.h).
#include "muon/distributed/layouts/tensor_parallel_dion.h"

#include <utility>
#include <vector>

#include "distributed/layouts/dion_split.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::TensorParallelDion] ";

}  // namespace

TensorParallelDion::TensorParallelDion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                                       DionOptions defaults,
                                       std::unordered_map<const void*, TensorParallelShard> shards)
    : TensorParallelBlocks(std::move(param_groups), std::move(defaults), std::move(shards), kWho) {}

void TensorParallelDion::step_parameters() {
  step_matrices([this](const at::Tensor& p, DionParamState& st, const DionOptions& o, int64_t rows, int64_t cols) {
    const auto* s = shard_of(p);
    if (s == nullptr) return muon::detail::dion_matrix_update(p.grad().reshape({rows, cols}), st, o);
    const auto dim = s->partition_dim();
    const auto sizes = balanced_split_sizes(s->global_shape()[static_cast<size_t>(dim)], s->group().size());
    const detail::DionSplit split{s->group(), rows, cols, /*split_cols=*/dim == 1,
                                  split_offset(sizes, s->group().rank()), p.size(dim)};
    // Q whole on every rank of the group, each drawing the same start.
    if (!st.Q().defined()) st.Q(muon::detail::dion_initial_q(rows, cols, o, p.options()));
    st.step(st.step() + 1);
    auto [block, q_new] = detail::dion_split_update(st.momentum(), p.grad(), st.Q(), st.step(), o, split);
    st.Q(std::move(q_new));
    return block;
  });
}

}  // namespace muon::distributed
