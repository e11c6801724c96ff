// What the ShardedOrthogonalizer files (src/distributed/layouts/sharded*.cpp)
// and the sharded Dion2 and SOAP share: the prefix of their messages, the
// rows of a matrix a rank holds, the options from a list of shards. Internal.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include <torch/optim/optimizer.h>

#include "muon/distributed/layouts/sharded_muon.h"

namespace muon::distributed::detail {

inline constexpr const char* kShardedWho = "[muon::distributed::ShardedMuon] ";

/// Rows [offset, offset + count) of `matrix` (M × N), zero past row M.
at::Tensor rows_padded(const at::Tensor& matrix, int64_t offset, int64_t count);

/// `options` with shards[i] as the rows params[i] holds (the constructors
/// that take the two lists); raises c10::ValueError prefixed by `who` when
/// their lengths differ.
ShardedOptions with_shards(const char* who, ShardedOptions options, const std::vector<at::Tensor>& params,
                           std::vector<RowShard> shards);

/// What an owner-compute optimizer of whole matrices (ShardedSoap,
/// ShardedDion) cannot step, refused before any collective with messages
/// prefixed by `who`: a mode other than owner_compute, parameters of fewer
/// than 2 global dims, tensor-parallel blocks. `optimizer` is the registry
/// name; `state` says what one owner keeps, `needs` why whole matrices.
void check_owner_compute_shards(const ShardedOptions& options,
                                const std::vector<torch::optim::OptimizerParamGroup>& groups, const char* who,
                                const char* optimizer, const char* state, const char* needs);

}  // namespace muon::distributed::detail
