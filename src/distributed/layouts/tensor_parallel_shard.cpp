// How a matrix is split: balanced sizes and offsets; the blocks of the
// whole-matrix optimizers' tensor-parallel layouts (tensor_parallel_block.h).
#include "muon/distributed/layouts/tensor_parallel_shard.h"

#include <c10/util/Exception.h>

#include <numeric>

#include "distributed/layouts/tensor_parallel_block.h"
#include "muon/distributed/layouts/tensor_parallel_blocks.h"

namespace muon::distributed {

std::vector<int64_t> balanced_split_sizes(int64_t total, int64_t parts) {
  TORCH_CHECK_VALUE(total >= 0, "[muon::distributed::balanced_split_sizes] total must be >= 0, got ",
                    total);
  TORCH_CHECK_VALUE(parts >= 1, "[muon::distributed::balanced_split_sizes] parts must be >= 1, got ",
                    parts);
  std::vector<int64_t> sizes(static_cast<size_t>(parts), total / parts);
  for (int64_t i = 0; i < total % parts; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

int64_t split_offset(const std::vector<int64_t>& sizes, int64_t index) {
  TORCH_CHECK_VALUE(index >= 0 && index <= static_cast<int64_t>(sizes.size()),
                    "[muon::distributed::split_offset] index must be in [0, ", sizes.size(), "], got ",
                    index);
  return std::accumulate(sizes.begin(), sizes.begin() + index, int64_t{0});
}

at::Tensor detail::gather_blocks(const at::Tensor& block, int64_t dim, const Group& group) {
  const auto parts = group.all_gather_uneven(block.contiguous().view({-1}));
  std::vector<at::Tensor> mats;
  mats.reserve(parts.size());
  const int64_t other = block.size(1 - dim);
  for (const auto& p : parts) mats.push_back(dim == 0 ? p.view({-1, other}) : p.view({other, -1}));
  return at::cat(mats, dim);
}

at::Tensor detail::own_block(const at::Tensor& whole, const TensorParallelShard& shard) {
  const auto dim = shard.partition_dim();
  const auto& group = shard.group();
  const auto sizes = balanced_split_sizes(whole.size(dim), group.size());
  return whole.narrow(dim, split_offset(sizes, group.rank()), sizes[static_cast<size_t>(group.rank())]);
}

void check_tensor_parallel_blocks(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                  const std::unordered_map<const void*, TensorParallelShard>& shards,
                                  const char* who) {
  for (const auto& group : groups) {
    for (const auto& p : group.params()) {
      const auto it = shards.find(p.unsafeGetTensorImpl());
      if (it == shards.end()) continue;
      const auto& s = it->second;
      TORCH_CHECK_VALUE(p.dim() == 2 && s.global_shape().size() == 2, who, "a tensor-parallel block must be ",
                        "a 2-D block of a 2-D matrix; got a block of shape ", p.sizes(), " of ",
                        at::IntArrayRef(s.global_shape()));
      const auto d = s.partition_dim();
      const auto sizes = balanced_split_sizes(s.global_shape()[static_cast<size_t>(d)], s.group().size());
      TORCH_CHECK_VALUE(p.size(1 - d) == s.global_shape()[static_cast<size_t>(1 - d)] &&
                            p.size(d) == sizes[static_cast<size_t>(s.group().rank())],
                        who, "block of shape ", p.sizes(), " does not fit rank ", s.group().rank(), " of ",
                        s.group().size(), " of a ", at::IntArrayRef(s.global_shape()), " matrix split along dim ", d);
    }
  }
}

}  // namespace muon::distributed
