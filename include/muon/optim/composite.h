#pragma once

/// Several optimizers presented as one `torch::optim::Optimizer`.
///
/// A model whose parameters split across optimizers (Muon for the hidden
/// matrices, AdamW or Lion for the rest, or any mix of registered ones)
/// trains with one object: one `step(closure)` (the closure runs once), one
/// `zero_grad`, every inner param group mirrored in `param_groups()` so that
/// LR schedulers and `set_lr` reach all of them, and one save/load archive
/// with a nested archive per inner optimizer. `muon::make_optimizer`
/// (muon/registry.h) returns one; `muon::MuonWithAdamW` (muon/optim/hybrid.h)
/// is one with a Muon part and an AdamW part.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "muon/optim/state_bytes.h"
#include "muon/optim/state_schema.h"
#include "muon/optim/step_guard.h"
#include "muon/optim/weight_update_hook.h"

namespace muon {

/// The param groups of inner optimizers mirrored into an outer optimizer's
/// own `param_groups()`: the same tensors, copies of the options. The outer
/// options are the ones in force (LR schedulers and direct edits act on
/// them) and are handed to the inner groups before each inner step. Used by
/// `CompositeOptimizer` and `muon::distributed::LayerwiseOptimizer`; the inner
/// optimizers must outlive it.
class GroupMirror {
 public:
  /// Appends a copy of every param group of `inner` to `outer` and records
  /// which inner group each one mirrors.
  void mirror(torch::optim::Optimizer& inner,
              std::vector<torch::optim::OptimizerParamGroup>& outer);

  /// Number of mirrored groups; they are the first groups of `outer`.
  size_t size() const { return sources_.size(); }

  /// Hands the options of the mirrored groups of `outer` to the inner groups
  /// they mirror. `outer` holds `extra` groups of its own after them. Raises
  /// c10::ValueError, prefixed with `who`, when groups or parameters were
  /// added after construction or a group holds options of another type than
  /// its inner group.
  void hand_options(const std::vector<torch::optim::OptimizerParamGroup>& outer, size_t extra,
                    const char* who) const;

  /// The other way: copies the inner groups' options into the mirrored groups
  /// of `outer` (after the inner optimizers loaded their own).
  void take_options(std::vector<torch::optim::OptimizerParamGroup>& outer) const;

 private:
  struct Source {
    torch::optim::Optimizer* optimizer;
    size_t group;
  };
  std::vector<Source> sources_;
};

/// One inner optimizer of a `CompositeOptimizer`.
struct CompositePart {
  /// Its name (e.g. the registry name "muon"); unique within the composite.
  std::string name;
  /// The optimizer, already built over its param groups.
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  /// The parameter names of each of its groups (same counts as the groups),
  /// stored in archives and checked on load. Empty: not checked.
  std::vector<std::vector<std::string>> group_names;
  /// The weight-update hooks of its groups (muon/optim/weight_update_hook.h),
  /// run around its step; null: none.
  std::shared_ptr<WeightUpdateHooks> hooks;
};

/// Inner optimizers as one (see the top of this header).
///
/// Param groups, in order: those of part 0, then part 1, ... They share the
/// inner groups' tensors and hold copies of their options; the composite's
/// options are the ones in force: each `step` copies them into the inner
/// optimizers, so schedulers and direct edits take effect. Groups and
/// parameters must not be added after construction. The per-parameter state
/// lives in the inner optimizers; this object's own `state()` stays empty.
class CompositeOptimizer : public torch::optim::Optimizer,
                           public StateBytes,
                           public StepGuard,
                           public InnerOptimizers {
 public:
  /// Takes ownership of `parts` (at least one, unique non-empty names, no
  /// tensor in two parts; raises c10::ValueError otherwise).
  explicit CompositeOptimizer(std::vector<CompositePart> parts);

  /// Runs `closure` (if any) once with grad mode enabled, then steps every
  /// part in order; returns the closure's loss. The checks of
  /// muon/optim/step_guard.h run once for all parts first (every part's
  /// options, parameters and gradients, the composite's non-finite policy),
  /// so a failure or a skip leaves every part untouched. The parts then
  /// step as one transaction: if one raises (a matrix function that fails,
  /// memory), every part's parameters, state and step counts are put back
  /// bit for bit (docs/optimizer.md, "A step happens whole").
  at::Tensor step(LossClosure closure = nullptr) override;
  /// Hands the composite's group options to the parts and validates them
  /// all (this library's optimizers check their own; LibTorch's AdamW, Adam,
  /// SGD, Adagrad and RMSprop options are checked here).
  void check_before_step() override;
  /// Agreed over every part that is distributed, in part order.
  std::pair<int64_t, int64_t> max_over_processes(int64_t code) override;
  /// Passes it on to every part.
  void set_agreed_by_layout(bool agreed) override;

  /// One archive: part names, group names and every group's options, plus
  /// each part's own archive nested under "parts/<i>/optimizer".
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Restores what `save` wrote into a composite with the same parts, groups
  /// and parameter names. The structure is checked before any part is
  /// loaded: a mismatch raises c10::ValueError naming the first difference
  /// and changes nothing. If a part rejects its own archive (e.g. a shape
  /// differs), the parts already loaded get their previous state back (a
  /// copy is kept during the load) and the error propagates.
  void load(torch::serialize::InputArchive& archive) override;

  /// Number of parts.
  size_t num_parts() const { return parts_.size(); }
  /// Name of part `i`.
  const std::string& part_name(size_t i) const;
  /// Part `i`'s optimizer.
  torch::optim::Optimizer& part(size_t i);
  /// The part named `name` (nullptr when there is none).
  torch::optim::Optimizer* find_part(const std::string& name);
  /// Index of the part that owns composite param group `group`.
  size_t part_of_group(size_t group) const;
  /// Parameter names of composite param group `group` (empty if not given).
  const std::vector<std::string>& group_names(size_t group) const;

  /// Bytes held in the optimizer state of every part.
  int64_t state_bytes() const override;

  /// InnerOptimizers: the parts, each with its name as its kind.
  size_t num_inner() const override { return parts_.size(); }
  torch::optim::Optimizer* inner_optimizer(size_t i) override { return &part(i); }
  std::string inner_kind(size_t i) const override { return part_name(i); }

 protected:
  /// For builders over the composite (`MuonWithAdamW`): `parts` may be empty
  /// (no parameter at all) and `defaults` are the optimizer's defaults.
  CompositeOptimizer(std::vector<CompositePart> parts,
                     std::unique_ptr<torch::optim::OptimizerOptions> defaults);

 private:
  void adopt(std::vector<CompositePart> parts);
  std::string describe(size_t group, size_t index) const;

  std::vector<CompositePart> parts_;
  GroupMirror mirror_;
  std::vector<size_t> group_part_;               // composite group → part
  std::vector<std::vector<std::string>> names_;  // per composite group
};

}  // namespace muon
