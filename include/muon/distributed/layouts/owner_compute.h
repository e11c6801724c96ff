#pragma once

/// What the owner-compute optimizers of whole matrices share (ShardedSoap,
/// ShardedKlSoap, ShardedIso, ShardedMoso): each matrix has one owner rank
/// (ShardedOrthogonalizer's owners, batched all-to-all), which holds the
/// matrix's whole state and steps it; this mixin answers the optimizer's
/// whole-matrix questions from that strategy.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "muon/distributed/layouts/sharded_muon.h"

namespace muon::distributed {

namespace detail {

/// The owner-compute strategy over `groups`, after checking what such an
/// optimizer cannot step (a mode other than owner_compute, parameters of
/// fewer than 2 global dims, tensor-parallel blocks), before any collective;
/// messages are prefixed by `who` and name `optimizer`, `state` (what one
/// owner keeps) and `needs` (why whole matrices).
std::shared_ptr<ShardedOrthogonalizer> owner_compute_strategy(ShardedOptions options,
                                                              std::vector<torch::optim::OptimizerParamGroup>& groups,
                                                              const char* who, const char* optimizer,
                                                              const char* state, const char* needs);

}  // namespace detail

/// `Base` (a whole-matrix optimizer: its whole_matrix_dims, holds_whole_state
/// and max_over_processes virtual) over row shards, its owners from the
/// strategy the derived class's constructor makes with `attach`.
template <typename Base>
class OwnerComputeOptimizer : public Base {
 public:
  using Base::Base;

  /// The whole matrix `param` is a row shard of (its global shape's dim 0 × the rest).
  std::pair<int64_t, int64_t> whole_matrix_dims(const at::Tensor& param) const override {
    return strategy_->whole_matrix_dims(param);
  }
  /// Whether this rank owns `param`'s matrix (and holds its state).
  bool holds_whole_state(const at::Tensor& param) const override { return strategy_->owns(param); }
  /// Collective over every shard group (muon/optim/step_guard.h).
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override {
    return strategy_->max_over_processes(code);
  }
  /// The owner of each parameter (flat order over the param groups), a rank of its shard's group.
  const std::vector<int64_t>& owners() const { return strategy_->owners(); }
  /// Rows of parameter i held by each rank of its group, in rank order.
  const std::vector<int64_t>& rows_per_rank(size_t i) const { return strategy_->rows_per_rank(i); }

 protected:
  /// Checks `options` against the param groups and makes the strategy
  /// (detail::owner_compute_strategy's arguments).
  void attach(ShardedOptions options, const char* who, const char* optimizer, const char* state, const char* needs) {
    strategy_ = detail::owner_compute_strategy(std::move(options), this->param_groups_, who, optimizer, state, needs);
  }

  std::shared_ptr<ShardedOrthogonalizer> strategy_;
};

}  // namespace muon::distributed
