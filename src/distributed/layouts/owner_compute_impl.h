#pragma once

// The constructors of muon::distributed::OwnerComputeOptimizer
// (muon/distributed/layouts/owner_compute.h), for the files that instantiate
// it for one optimizer (`template class OwnerComputeOptimizer<Soap, ShardedSoap>;`).
#include <utility>
#include <vector>

#include "distributed/layouts/sharded_internal.h"
#include "muon/distributed/layouts/owner_compute.h"

namespace muon::distributed {

template <typename Base, typename Self>
OwnerComputeOptimizer<Base, Self>::OwnerComputeOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults,
    ShardedOptions options)
    : Base(std::move(param_groups), std::move(defaults), /*check=*/true) {
  constexpr const OwnerComputeNames& names = Self::kNames;
  const auto& kept = static_cast<const Options&>(this->defaults());
  strategy_ = detail::owner_compute_strategy(std::move(options), this->param_groups_, names.who,
                                             Self::optimizer_name(kept), names.state, names.needs);
}

template <typename Base, typename Self>
OwnerComputeOptimizer<Base, Self>::OwnerComputeOptimizer(std::vector<at::Tensor> params,
                                                         std::vector<RowShard> shards,
                                                         Options defaults, ShardedOptions options)
    : OwnerComputeOptimizer(
          std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(params)},
          std::move(defaults),
          detail::with_shards(Self::kNames.who, std::move(options), params, std::move(shards))) {}

}  // namespace muon::distributed
