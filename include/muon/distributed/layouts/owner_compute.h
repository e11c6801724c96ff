#pragma once

/// What the owner-compute optimizers of whole matrices share (ShardedSoap,
/// ShardedKlSoap, ShardedIso, ShardedMoso, ShardedPsgdPro): each matrix has
/// one owner rank (ShardedOrthogonalizer's owners, batched all-to-all), which
/// holds the matrix's whole state and steps it; this base gives them their
/// constructors and answers the optimizer's whole-matrix questions from that
/// strategy.
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

/// What an owner-compute optimizer's messages name (the arguments of
/// detail::owner_compute_strategy).
struct OwnerComputeNames {
  /// Prefixes every message, e.g. "[muon::distributed::ShardedSoap] ".
  const char* who;
  /// The registry name, e.g. "soap".
  const char* optimizer;
  /// What one owner keeps, e.g. "SOAP state".
  const char* state;
  /// Why whole matrices, e.g. "preconditions whole matrices".
  const char* needs;
};

/// `Base` (a whole-matrix optimizer: its whole_matrix_dims, holds_whole_state
/// and max_over_processes virtual) over row shards, its owners from the
/// owner-compute strategy. `Self`, the derived class, names itself with
/// `static constexpr OwnerComputeNames kNames` (a `Self::optimizer_name` of
/// the defaults replaces kNames.optimizer) and steps its parameters
/// (`step_parameters`, with detail::owner_compute_step). The constructors
/// are defined where the library instantiates the class for each optimizer.
template <typename Base, typename Self>
class OwnerComputeOptimizer : public Base {
 public:
  using Options = typename Base::OptionsType;

  /// Over `param_groups` (groups without options get `defaults`); every
  /// parameter must have a RowShard in `options` (global shape of >= 2 dims,
  /// no tensor-parallel block) and `options.mode()` must be owner_compute.
  /// Collective over every shard's group, as ShardedMuon's construction: the
  /// ranks agree on the shapes, dtypes, options and the ShardedOptions, and
  /// raise the same c10::ValueError on every rank naming the first difference.
  OwnerComputeOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults,
                        ShardedOptions options);
  /// Over one group: `params[i]` is described by `shards[i]`.
  OwnerComputeOptimizer(std::vector<at::Tensor> params, std::vector<RowShard> shards, Options defaults = {},
                        ShardedOptions options = {});

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
  /// The registry name in messages: kNames.optimizer, whatever the defaults.
  static const char* optimizer_name(const Options& /*defaults*/) { return Self::kNames.optimizer; }

 protected:
  std::shared_ptr<ShardedOrthogonalizer> strategy_;
};

}  // namespace muon::distributed
