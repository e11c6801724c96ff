#pragma once

/// The base of the whole-matrix optimizers over tensor-parallel blocks
/// (TensorParallelKlSoap, TensorParallelDion): which parameters are blocks
/// of which matrix, checked at construction, and the whole matrix's shape
/// for a block (the state schemas and checkpoints read it).
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel_shard.h"

namespace muon::distributed {

/// Raises c10::ValueError, naming `who`, for a parameter of `groups` with an
/// entry in `shards` (by TensorImpl) that is not a 2-D block of a 2-D matrix
/// or whose shape does not fit its shard's.
void check_tensor_parallel_blocks(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                  const std::unordered_map<const void*, TensorParallelShard>& shards,
                                  const char* who);

/// Base (a WholeMatrixOptimizer over Options) whose parameters with an entry
/// in `shards` are blocks of 2-D matrices; the others are whole.
template <typename Base, typename Options>
class TensorParallelBlocks : public Base {
 public:
  /// Over `param_groups` (groups without options get `defaults`); a
  /// parameter with an entry in `shards` (by TensorImpl) is its block of that
  /// 2-D matrix. Raises c10::ValueError, naming `who`, for a block that is
  /// not 2-D or whose shape does not fit its shard's.
  TensorParallelBlocks(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults,
                       std::unordered_map<const void*, TensorParallelShard> shards, const char* who)
      : Base(std::move(param_groups), std::move(defaults)), shards_(std::move(shards)) {
    check_tensor_parallel_blocks(this->param_groups(), shards_, who);
  }

  /// The whole matrix's (rows, cols) for a block, as Base's otherwise.
  std::pair<int64_t, int64_t> whole_matrix_dims(const at::Tensor& param) const override {
    const auto* shard = shard_of(param);
    if (shard == nullptr) return Base::whole_matrix_dims(param);
    return {shard->global_shape()[0], shard->global_shape()[1]};
  }

 protected:
  /// The split of the matrix `param` is a block of; nullptr for a whole parameter.
  const TensorParallelShard* shard_of(const at::Tensor& param) const {
    const auto it = shards_.find(param.unsafeGetTensorImpl());
    return it == shards_.end() ? nullptr : &it->second;
  }

 private:
  std::unordered_map<const void*, TensorParallelShard> shards_;
};

}  // namespace muon::distributed
