// The sharded layout's rows (ZeRO-2): this rank's master rows of every full
// parameter, the bucketed reduce-scatter of the full gradients into them and
// the bucketed all-gather of the updated rows back (muon/distributed/layouts/layout.h).
#pragma once

#include <ATen/ATen.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/runtime/group.h"

namespace muon::distributed::detail {

class RowShards {
 public:
  /// Rows of every parameter of `named_parameters` split over `dp`
  /// (balanced_split_sizes). Collective over `dp`: the ranks compare their
  /// parameters (names, shapes, dtypes) and the checksums of their values.
  /// Raises c10::ValueError for a 0-d or undefined parameter, a
  /// tensor-parallel block naming no parameter, bucket_bytes < 1.
  RowShards(const torch::OrderedDict<std::string, at::Tensor>& named_parameters, const Group& dp,
            const TensorParallelShards& tensor_parallel, TensorParallelMode tp_mode,
            int64_t bucket_bytes, const char* who);

  /// The full parameters given.
  const torch::OrderedDict<std::string, at::Tensor>& parameters() const { return params_; }
  /// This rank's rows of each.
  const torch::OrderedDict<std::string, at::Tensor>& shards() const { return shards_; }
  /// group = dp and a RowShard for every parameter.
  const DistributedLayout& layout() const { return layout_; }
  const Group& group() const { return layout_.group; }
  const std::vector<int64_t>& rows_per_rank(const std::string& name) const;
  int64_t row_offset(const std::string& name) const;
  size_t bucket_count() const { return buckets_.size(); }
  /// Bytes of the master rows.
  int64_t shard_bytes() const;

  /// Sets the shards' gradients to the dp average of the active full gradients.
  void reduce_scatter(const std::vector<bool>& active);
  /// Copies the active parameters' rows of every rank into the full parameters.
  void all_gather(const std::vector<bool>& active);
  void clear_shard_grads();

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into the parameters, in order
  };
  size_t index_of(const std::string& name) const;

  const char* who_;
  torch::OrderedDict<std::string, at::Tensor> params_;
  torch::OrderedDict<std::string, at::Tensor> shards_;
  std::vector<std::vector<int64_t>> rows_;     // per parameter: rows of every rank
  std::vector<std::vector<int64_t>> offsets_;  // per parameter: first row of every rank
  std::vector<int64_t> row_numel_;             // per parameter: elements per row
  std::unordered_map<std::string, size_t> index_;
  std::vector<Bucket> buckets_;
  DistributedLayout layout_;
};

}  // namespace muon::distributed::detail
