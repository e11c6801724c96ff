#pragma once

/// Muon for the hidden matrices, AdamW for everything else, as one optimizer.
///
/// Muon is meant for 2-D hidden weights; embeddings, the output head, norms,
/// biases and scalars train with AdamW in the same step (Jordan et al. 2024;
/// Liu et al. 2025). `MuonWithAdamW` routes a module's named parameters with
/// `muon::RoutingRules` (muon/optim/routing.h), runs `muon::Muon` on one side
/// and LibTorch's own `torch::optim::AdamW` on the other, and presents them as
/// a single `torch::optim::Optimizer` through `muon::CompositeOptimizer`
/// (muon/optim/composite.h): one `step(closure)`, one `zero_grad`, every
/// param group visible to LR schedulers, one save/load archive.
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "muon/optim/composite.h"
#include "muon/optim/muon.h"
#include "muon/optim/routing.h"

namespace muon {

/// AdamW options used beside Muon by default: lr 3e-4, betas (0.9, 0.95),
/// eps 1e-8, weight_decay 0 — the common setting for the scalar optimizer of
/// Muon runs (embeddings, head, norms and biases are usually not decayed).
torch::optim::AdamWOptions default_aux_adamw_options();

/// Builds the Muon half of `MuonWithAdamW` from its param groups and default
/// options; lets the hybrid run a Muon subclass (e.g.
/// `muon::distributed::tensor_parallel_muon_factory` for tensor-parallel shards).
using MuonFactory = std::function<std::unique_ptr<Muon>(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, const MuonOptions& defaults)>;

/// Options of `MuonWithAdamW`, as chained setters.
struct MuonWithAdamWOptions {
  /// Options of the default Muon group (every matrix without a pattern group)
  /// and the defaults of the inner Muon.
  TORCH_ARG(MuonOptions, muon);
  /// Options of the default AdamW group.
  TORCH_ARG(torch::optim::AdamWOptions, adamw) = default_aux_adamw_options();
  /// Which parameter goes where.
  TORCH_ARG(RoutingRules, routing);
  /// Builds the inner Muon; empty: plain `muon::Muon`.
  TORCH_ARG(MuonFactory, muon_factory);

 public:
  /// Parameters routed to Muon whose name matches glob `pattern` form their
  /// own Muon group with `options` (e.g. a fused QKV weight with
  /// `split_sizes`, stacked experts, another lr). First matching pattern wins.
  MuonWithAdamWOptions& muon_group(const std::string& pattern, MuonOptions options);
  /// Parameters routed to AdamW whose name matches glob `pattern` form their
  /// own AdamW group with `options`. First matching pattern wins.
  MuonWithAdamWOptions& adamw_group(const std::string& pattern, torch::optim::AdamWOptions options);

  /// The Muon pattern groups, in the order added.
  const std::vector<std::pair<std::string, MuonOptions>>& muon_groups() const { return muon_groups_; }
  /// The AdamW pattern groups, in the order added.
  const std::vector<std::pair<std::string, torch::optim::AdamWOptions>>& adamw_groups() const {
    return adamw_groups_;
  }

 private:
  std::vector<std::pair<std::string, MuonOptions>> muon_groups_;
  std::vector<std::pair<std::string, torch::optim::AdamWOptions>> adamw_groups_;
};

/// Muon + AdamW over a module's named parameters: a `CompositeOptimizer`
/// with a part "muon" and a part "adamw", built from the routing.
///
///     muon::MuonWithAdamW opt(model->named_parameters());
///     std::cout << opt.routing_table();
///     torch::optim::StepLR sched(opt, 1000, 0.5);
///     for (...) { opt.zero_grad(); loss.backward(); opt.step(); sched.step(); }
///
/// Param groups, in order: the default Muon group, the Muon pattern groups,
/// the default AdamW group, the AdamW pattern groups; empty ones are left
/// out, and so is a part with no group. Their options (MuonOptions or
/// torch::optim::AdamWOptions) are the ones in force: each `step` hands them
/// to the two inner optimizers, so LR schedulers and direct edits take
/// effect. The per-parameter state lives in the inner optimizers (`muon()`,
/// `adamw()`); this object's own `state()` stays empty. Groups must not be
/// added after construction. `save`/`load` use the composite's archive, with
/// the parameter names of every group checked on load.
class MuonWithAdamW : public CompositeOptimizer {
 public:
  /// Routes `named_parameters` (e.g. `module->named_parameters()`) and builds
  /// both halves. Raises c10::ValueError for a pattern group that matches no
  /// parameter and for invalid options (the inner optimizers' checks).
  explicit MuonWithAdamW(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                         MuonWithAdamWOptions options = {});

  /// Where each parameter went, in the order given.
  const std::vector<RouteDecision>& routing() const { return routing_; }
  /// `format_routing(routing())`: one line per parameter.
  std::string routing_table() const;

  /// Whether param group `index` is a Muon group (otherwise an AdamW group).
  bool is_muon_group(size_t index) const;
  /// The inner Muon (nullptr when no parameter was routed to Muon).
  Muon* muon() { return muon_; }
  /// The inner AdamW (nullptr when no parameter was routed to AdamW).
  torch::optim::AdamW* adamw() { return adamw_; }

 private:
  // The routing and the two parts, computed before the composite is built.
  struct Built;
  static Built build(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                     const MuonWithAdamWOptions& options);
  explicit MuonWithAdamW(Built built);

  std::vector<RouteDecision> routing_;
  size_t num_muon_groups_ = 0;  // groups [0, n) are Muon's
  Muon* muon_ = nullptr;        // owned by the composite's parts
  torch::optim::AdamW* adamw_ = nullptr;
};

}  // namespace muon
