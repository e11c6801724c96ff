#pragma once

/// Layer-wise distributed optimization for replicated (data-parallel)
/// parameters, as Megatron-Core's LayerWiseDistributedOptimizer and Keller
/// Jordan's distributed Muon do: every parameter is owned by exactly one rank
/// (longest-processing-time packing on the Newton–Schulz cost, see
/// assignment.h); only the owner keeps its optimizer state and computes its
/// update; the updated parameters are then all-gathered in coalesced buckets,
/// the gather of one bucket overlapping the update of the next.
///
/// The inner optimizer is any `torch::optim::Optimizer` built over the owned
/// parameters by a factory: `muon::Muon`, `muon::MuonWithAdamW` (so the
/// AdamW half is distributed the same way), or anything the registry makes.
/// Each rank's result equals the single-process optimizer over all
/// parameters: the owner runs the same code on the same gradient, and the
/// gather copies its bytes.
///
/// Gradients must already be averaged over the ranks (DDP, or
/// `all_reduce_gradients` below) before `step()`.
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "muon/distributed/runtime/group.h"
#include "muon/optim/composite.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/state_schema.h"
#include "muon/optim/step_guard.h"

namespace muon::distributed {

/// Default bytes each rank contributes to one all-gather bucket.
constexpr int64_t kDefaultBucketBytes = int64_t{8} << 20;

/// Options of `LayerwiseOptimizer`.
struct LayerwiseOptions {
  /// Bytes of updated parameters each rank contributes to one all-gather
  /// (> 0). A parameter larger than this is a bucket of its own.
  TORCH_ARG(int64_t, bucket_bytes) = kDefaultBucketBytes;
  /// All-gathers left in flight while the next bucket is updated (>= 0).
  /// 0: no overlap; the whole update runs, then every bucket is gathered.
  TORCH_ARG(int64_t, max_in_flight) = 2;
};

/// Builds the inner optimizer over the parameters a rank owns (names and
/// tensors in the order given to `LayerwiseOptimizer`); never called with an
/// empty set. At construction it is also called once over copies of all
/// parameters (same names, shapes and values), on every rank, to read the
/// options it gives each param group (the ranks compare them); that
/// optimizer is discarded before its first step. A factory therefore finds
/// its parameters in `owned` by name, not by tensor identity. Whatever the
/// owner's optimizer does to its parameters when built, every rank holds
/// afterwards (the layout all-gathers them once).
using InnerOptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const torch::OrderedDict<std::string, at::Tensor>& owned)>;

/// The cost of updating one parameter, for the owner packing.
using ParameterCost = std::function<double(const std::string& name, const at::Tensor& param)>;

/// Default cost: `newton_schulz_cost` of the parameter's matrix view
/// (dim 0 × the rest) for ndim >= 2, its element count otherwise (an
/// element-wise update such as AdamW's).
double default_parameter_cost(const std::string& name, const at::Tensor& param);

/// One optimizer object over replicated parameters, distributed layer-wise
/// over `group`. Collective: every rank constructs it with the same named
/// parameters (names, shapes, dtypes, order), the same `options`, an inner
/// factory that gives every param group the same options, and the same
/// parameter values (replicated parameters start equal: broadcast them
/// first, `muon::distributed::broadcast_parameters`); a difference raises
/// c10::ValueError on every rank naming the first one, e.g. "lr of param
/// group 0 is 0.01 on rank 1, 0.02 on rank 0" (muon/distributed/runtime/agreement.h).
/// `step`, `save` and `load` are collective
/// too (save/load write and read this rank's own state: one archive per rank).
///
/// `param_groups()` mirror the inner optimizer's groups (`muon::GroupMirror`:
/// LR schedulers act on them and `step` hands their options to the inner
/// optimizer), followed by one group of the parameters other ranks own, so
/// that `zero_grad()` clears every gradient; that last group's options are
/// unused.
class LayerwiseOptimizer : public torch::optim::Optimizer,
                           public StateBytes,
                           public StepGuard,
                           public InnerOptimizers {
 public:
  LayerwiseOptimizer(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                     Group group, const InnerOptimizerFactory& make_inner,
                     LayerwiseOptions options = {},
                     const ParameterCost& cost = default_parameter_cost);

  /// Runs `closure` (if any) once with grad mode enabled, updates the owned
  /// parameters bucket by bucket and all-gathers them; returns the loss.
  /// The checks of muon/optim/step_guard.h run first for the owned
  /// parameters (the inner optimizer's options, gradients, this optimizer's
  /// non-finite policy) and are agreed over the group: every rank raises,
  /// skips or steps together.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Hands the group options to the inner optimizer and validates them.
  void check_before_step() override;
  /// Collective over the group.
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override;
  /// Passes it on to the inner optimizer.
  void set_agreed_by_layout(bool agreed) override;

  /// This rank's inner state and options, with the layout it belongs to.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores what `save` wrote on the same rank of the same layout (same
  /// world size, parameters and owners); raises c10::ValueError otherwise.
  void load(torch::serialize::InputArchive& archive) override;

  /// The owner rank of each parameter, in the order given.
  const std::vector<int64_t>& owners() const { return owners_; }
  /// The parameter names, in the order given.
  const std::vector<std::string>& names() const { return names_; }
  /// The inner optimizer of this rank (nullptr when it owns no parameter).
  torch::optim::Optimizer* inner() { return inner_.get(); }
  /// InnerOptimizers: this rank's inner optimizer (none when it owns nothing).
  size_t num_inner() const override { return 1; }
  torch::optim::Optimizer* inner_optimizer(size_t) override { return inner_.get(); }
  std::string inner_kind(size_t) const override { return ""; }
  /// The group it runs on.
  const Group& group() const { return group_; }
  /// Bytes of optimizer state tensors on this rank (the inner optimizer's).
  int64_t state_bytes() const override;

 private:
  struct Entry {
    int64_t param;   // index into params_
    int64_t offset;  // byte offset in the bucket
    int64_t bytes;
  };
  // Hands this optimizer's group options (set by schedulers) to the inner one.
  void sync_options() const;
  // Starts the all-gather of bucket k of every rank (this rank's part packed).
  PendingCollective start_gather(size_t k) const;
  // Copies the other ranks' parameters of bucket k out of the gathered bytes.
  void unpack(size_t k, const std::vector<at::Tensor>& gathered);

  Group group_;
  LayerwiseOptions options_;
  // Raises on every rank unless all have a gradient for the same parameters.
  void agree_on_gradients() const;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<int64_t> owners_;
  int64_t signature_ = 0;
  // buckets_[rank][k]: the parameters rank `rank` sends in its k-th bucket.
  std::vector<std::vector<std::vector<Entry>>> buckets_;
  std::vector<int64_t> bucket_bytes_;  // per k: the largest contribution over ranks
  std::unique_ptr<torch::optim::Optimizer> inner_;
  GroupMirror mirror_;          // the inner groups, first in param_groups_
  std::vector<int64_t> owned_;  // indices into params_ of this rank's parameters
};

/// Averages the gradients of `params` over `group`, in place (for training
/// without DDP): gradients are packed per dtype into flat buckets of up to
/// `bucket_bytes` and each bucket is all-reduced once. Every rank must pass
/// the same parameters, each with a gradient (c10::ValueError otherwise).
void all_reduce_gradients(const std::vector<at::Tensor>& params, const Group& group,
                          int64_t bucket_bytes = int64_t{32} << 20);

}  // namespace muon::distributed
