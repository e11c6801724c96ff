// What the ShardedOrthogonalizer files (src/distributed/layouts/sharded*.cpp)
// share: the prefix of their messages and the rows of a matrix a rank
// holds. Internal.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace muon::distributed::detail {

inline constexpr const char* kShardedWho = "[muon::distributed::ShardedMuon] ";

/// Rows [offset, offset + count) of `matrix` (M × N), zero past row M.
at::Tensor rows_padded(const at::Tensor& matrix, int64_t offset, int64_t count);

}  // namespace muon::distributed::detail
