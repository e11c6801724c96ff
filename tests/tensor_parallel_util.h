#pragma once
// Blocks of a tensor-parallel matrix and the data the tensor-parallel tests
// feed every rank alike.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel_shard.h"

namespace muon::test {

/// Relative fp32 agreement of a tensor-parallel result with one process's
/// (the reasoning: the header of test_dist_tensor_parallel.cpp).
inline constexpr double kFp32Tolerance = 1e-5;

/// Deliberately uneven blocks: rank r gets a share proportional to r + 1,
/// the last takes the rest (24 rows over 4 ranks: 2, 4, 7, 11).
inline std::vector<int64_t> uneven_sizes(int64_t total, int world) {
  std::vector<int64_t> sizes;
  const int64_t weight_sum = static_cast<int64_t>(world) * (world + 1) / 2;
  int64_t used = 0;
  for (int r = 0; r + 1 < world; ++r) {
    sizes.push_back(std::max<int64_t>(1, total * (r + 1) / weight_sum));
    used += sizes.back();
  }
  sizes.push_back(total - used);
  return sizes;
}

/// Rank `rank`'s block (sizes along `dim`) of `whole`, contiguous.
inline at::Tensor block_of(const at::Tensor& whole, int64_t dim,
                           const std::vector<int64_t>& sizes, int rank) {
  return whole.narrow(dim, muon::distributed::split_offset(sizes, rank), sizes[static_cast<size_t>(rank)])
      .contiguous();
}

/// The gradient of step `step` for matrix `index` of `shape`: the same on
/// every rank (each thread draws it from its own generator).
inline at::Tensor gradient(int step, int index, c10::IntArrayRef shape) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 * step + index + 17));
  return at::randn(shape, gen, at::TensorOptions(at::kFloat));
}

}  // namespace muon::test
