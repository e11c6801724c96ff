// How a matrix is split: balanced sizes and offsets.
#include "muon/distributed/layouts/tensor_parallel_shard.h"

#include <c10/util/Exception.h>

#include <numeric>

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

}  // namespace muon::distributed
