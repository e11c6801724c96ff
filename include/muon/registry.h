#pragma once

/// The optimizer registry and the one entry point that builds an optimizer
/// from a config (the C++ form of Megatron-Core's emerging-optimizer
/// registry and get_megatron_optimizer).
///
/// An entry maps a name to: the option fields it declares (config fields
/// `<name>_<option>`), how a parameter group's resolved settings become that
/// optimizer's options (`make_options`), a factory over param groups, the
/// default per-parameter override rules (for Muon: 1-D, embedding and
/// output-head parameters go to the scalar optimizer) and an optional state
/// initializer. Built-ins, each registered from its optimizer's own source
/// file (src/optim/*.cpp, called in order by register_builtins,
/// src/registry_builtins.cpp): muon, adaptive_muon, adamw, adam, sgd
/// (LibTorch's own), lion, laprop, signum, sim_ademamix, soap, dion2, nordion2,
/// polargrad, scion, mop, spel and muon_hyperball.
///
/// Layers built on the registry add config fields of their own through a
/// `ConfigExtension`: the distributed layouts (muon/distributed/layouts/make.h) add
/// `layout`, `layout_*` and `muon_tp_mode` to the global registry this way
/// (through `extend_global`, so that the registry names no layer).
///
///     auto config = muon::OptimizerConfig().set("optimizer", "muon").set("lr", 0.02);
///     auto opt = muon::make_optimizer(model->named_parameters(), config);
///     std::cout << muon::explain(model->named_parameters(), config);
///     muon::WarmupDecaySchedule sched(*opt, muon::lr_schedule_options(config));
///
/// Users add their own with `OptimizerRegistry::global().add(entry)`; its
/// fields then exist in every config created afterwards (JSON keys and flags
/// included).
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "muon/config.h"
#include "muon/optim/composite.h"
#include "muon/optim/orthogonalizer.h"
#include "muon/optim/state_schema.h"
#include "muon/schedule.h"

namespace muon {

/// The settings of one param group as an optimizer sees them: the common
/// per-parameter fields (lr, weight_decay, ...) under their own names and
/// the optimizer's prefixed fields with the prefix stripped (`muon_momentum`
/// → `momentum`), generically.
class OptimizerSettings {
 public:
  /// Settings from stripped name → value.
  explicit OptimizerSettings(std::map<std::string, FieldValue> values);
  /// The value of `key`; raises c10::ValueError naming the key and the ones present.
  const FieldValue& get(const std::string& key) const;
  /// Typed accessors (an int is accepted for get_double).
  bool get_bool(const std::string& key) const;
  /// See get_bool.
  int64_t get_int(const std::string& key) const;
  /// See get_bool.
  double get_double(const std::string& key) const;
  /// See get_bool.
  const std::string& get_string(const std::string& key) const;
  /// See get_bool.
  const std::vector<int64_t>& get_int_list(const std::string& key) const;
  /// See get_bool.
  const std::vector<std::string>& get_string_list(const std::string& key) const;
  /// Whether `key` is present.
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  /// Every value.
  const std::map<std::string, FieldValue>& values() const { return values_; }

 private:
  std::map<std::string, FieldValue> values_;
};

/// A registry entry (see the top of this header).
struct OptimizerEntry {
  /// Registry name; also the prefix of its option fields.
  std::string name;
  /// One line of documentation.
  std::string doc;
  /// Option fields, declared without the prefix (config field `<name>_<field>`).
  std::vector<FieldSpec> fields;
  /// Other entries whose prefixed fields this one also reads, stripped the
  /// same way (adaptive_muon reads muon_*, adamw reads adam_*). Its own
  /// fields win over theirs; theirs win over common fields of the same name.
  std::vector<std::string> uses_fields_of;
  /// Settings of one param group → that group's options.
  std::function<std::unique_ptr<torch::optim::OptimizerOptions>(const OptimizerSettings&)>
      make_options;
  /// Builds the optimizer over groups that each carry options from
  /// `make_options` (at least one group). `settings[i]` are group i's.
  std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const std::vector<OptimizerSettings>& settings)>
      factory;
  /// For a Muon-family entry (a `muon::Muon` whose step 4 runs through an
  /// `Orthogonalizer`): the optimizer over `groups` with `strategy` as its
  /// orthogonalization, how the distributed layouts that split matrices
  /// (tensor_parallel, sharded; muon/distributed/layouts/make.h) build it with
  /// theirs. Optional: without it those layouts run the entry's `factory`
  /// on the local blocks or shards as they are (element-wise optimizers).
  std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      const std::vector<OptimizerSettings>& settings, std::shared_ptr<Orthogonalizer> strategy)>
      strategy_factory;
  /// Rules applied before the user's when this is the config's `optimizer`.
  std::vector<OverrideRule> default_overrides;
  /// Called once on the new optimizer (e.g. to create state eagerly); optional.
  std::function<void(torch::optim::Optimizer&)> init_state;
  /// How the weight-update hooks (muon/optim/weight_update_hook.h) read its
  /// step p ← c·p − lr·U: the weight decay it applies before the update
  /// ("decoupled", "independent", "l2", "palm") when its settings name none
  /// (a `weight_decay_mode` or `weight_decay_method` field names it). Empty
  /// (a plugin's default): a hook on it raises, with `hook_refusal`.
  std::string hook_weight_decay;
  /// Reads the weight decay coefficient from one of its param groups'
  /// options as they are at a step, so that the hooks follow an edit of
  /// `weight_decay` after construction (a schedule, a Python param group).
  /// Empty: the hooks use the group's `weight_decay` setting at construction.
  std::function<double(const torch::optim::OptimizerOptions&)> hook_weight_decay_of;
  /// Why the hooks refuse it (its step is not of that form), for the message.
  std::string hook_refusal = "it does not say how it decays the weight (OptimizerEntry::hook_weight_decay)";
  /// What its per-parameter state is (muon/optim/state_schema.h):
  /// checkpoints, the Python package, state bytes and `explain` read it.
  /// Optional: an optimizer without one builds and steps, and anything
  /// that must handle its state refuses it by name.
  StateSchema state;
};

/// Config fields added by a layer built on the registry rather than by an
/// optimizer, with a check that keeps the single-process build honest about
/// them.
struct ConfigExtension {
  /// Who adds the fields (for messages), e.g. "muon::distributed".
  std::string name;
  /// Whole-config fields under their own names; in the schema after the
  /// common fields.
  std::vector<FieldSpec> common_fields;
  /// Option fields of registered optimizers: optimizer name → fields
  /// declared without the prefix (config field `<optimizer>_<field>`). They
  /// follow the optimizer's own fields in the schema, and its settings (and
  /// those of entries that use its fields) carry them like its own.
  std::map<std::string, std::vector<FieldSpec>> option_fields;
  /// Called by make_optimizer with an optimizer's name and one param group's
  /// settings when the entry's own factory builds that optimizer (no
  /// BuildContext factory replaces it); raises c10::ValueError for settings
  /// that only a replacement can build. Optional.
  std::function<void(const std::string& optimizer, const OptimizerSettings& settings)>
      check_own_factory;
};

/// Name → entry, in registration order. Thread-safe; entries are immutable
/// once added (references stay valid).
class OptimizerRegistry {
 public:
  /// An empty registry (the global one holds the built-ins).
  OptimizerRegistry() = default;
  /// The process-wide registry, created on first use with the built-ins,
  /// then the `extend_global` functions given so far (with libmuon: the
  /// distributed layer's fields, muon::distributed::register_config_fields).
  static OptimizerRegistry& global();
  /// Runs `extend` on the global registry: when it is created (after the
  /// built-ins, in the order given), or at once when it exists. How a layer
  /// linked into the program adds its extension from a static initializer
  /// without the registry naming it. `extend` must not call global(); its
  /// exception propagates (from global() at creation, which then builds the
  /// registry afresh on its next call).
  static void extend_global(std::function<void(OptimizerRegistry&)> extend);
  /// Registers the built-ins (muon, adaptive_muon, adam, adamw, sgd, lion, laprop, signum,
  /// sim_ademamix, soap, dion2, nordion2, polargrad, scion, mop, spel, muon_hyperball) in `registry`.
  static void register_builtins(OptimizerRegistry& registry);

  /// Adds `entry`. Raises c10::ValueError for an empty or duplicate name, a
  /// missing make_options or factory, a field name that is empty or would
  /// collide with an existing config field, an unknown `uses_fields_of`
  /// entry, or an invalid default override; nothing is added then.
  void add(OptimizerEntry entry);
  /// Adds `extension`'s fields and check. Raises c10::ValueError for an
  /// empty name, option fields of an unregistered optimizer, or a field
  /// whose name is empty, would collide with an existing config field, or
  /// whose default fails its own check; nothing is added then.
  void extend(ConfigExtension extension);
  /// Whether `name` is registered.
  bool has(const std::string& name) const;
  /// The registered names, in registration order.
  std::vector<std::string> keys() const;
  /// The entry `name`; an unknown name raises c10::ValueError listing the
  /// registered names and the nearest one.
  std::shared_ptr<const OptimizerEntry> at(const std::string& name) const;
  /// The schema: the common fields, the extensions' common fields, then
  /// every entry's prefixed fields (its own, then those extensions add).
  std::vector<FieldSpec> fields() const;
  /// The fields every optimizer's settings carry under their own names:
  /// muon::common_fields(), then the extensions'.
  std::vector<FieldSpec> shared_fields() const;
  /// The option fields of optimizer `name`, without the prefix: its entry's,
  /// then those extensions add (unknown names raise as `at`).
  std::vector<FieldSpec> option_fields(const std::string& name) const;
  /// The extensions, in the order added.
  std::vector<std::shared_ptr<const ConfigExtension>> extensions() const;
  /// One line per registered optimizer: name and doc.
  std::string help() const;
  /// The entry whose state schema describes `optimizer` (a leaf: it keeps
  /// per-parameter state itself): `kind`'s when that entry declares a schema
  /// that claims it, otherwise the last registered entry whose schema
  /// claims it; nullptr when none does.
  std::shared_ptr<const OptimizerEntry> state_entry_of(const torch::optim::Optimizer& optimizer,
                                                       const std::string& kind = "") const;

  /// What a plugin's initializers registered while staging (muon::load_plugin).
  struct Staged {
    std::vector<std::string> names;  ///< entries staged, in order
    std::string error;               ///< the first refused add or extend ("" when none)
  };
  /// Holds back what the shared library load_plugin is loading registers:
  /// until end_staging, add and extend called on this thread are checked as
  /// always (against the registry and what is staged) but neither change the
  /// registry nor throw (an exception inside dlopen's initializers ends the
  /// process): each is staged, or its error kept. Other threads' calls are
  /// checked against both and take effect at once. Raises c10::ValueError
  /// when staging is already under way.
  void begin_staging();
  /// Ends staging: with `commit` and no error, adds what was staged, in
  /// order; otherwise drops it, so that the registry is as before
  /// begin_staging. Returns what was staged.
  Staged end_staging(bool commit);

 private:
  std::vector<FieldSpec> fields_locked(bool with_staged = false) const;
  std::vector<std::string> names_locked() const;  // registered and staged
  std::shared_ptr<const OptimizerEntry> checked_locked(OptimizerEntry entry) const;
  std::shared_ptr<const ConfigExtension> checked_locked(ConfigExtension extension) const;
  bool staging_here() const;

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const OptimizerEntry>> entries_;
  std::vector<std::shared_ptr<const ConfigExtension>> extensions_;
  // Staging (begin_staging): the thread, what it registered, its first error.
  std::thread::id staging_thread_;
  std::vector<std::shared_ptr<const OptimizerEntry>> staged_;
  std::vector<std::shared_ptr<const ConfigExtension>> staged_extensions_;
  std::string staged_error_;
};

/// The common fields every config has (before any extension's and
/// optimizer's): the optimizer, scalar_optimizer, lr, weight_decay and the
/// LR schedule.
std::vector<FieldSpec> common_fields();

/// The resolution of one parameter: its optimizer and every field's value.
struct ResolvedParameter {
  /// Name as given.
  std::string name;
  /// Shape.
  std::vector<int64_t> shape;
  /// The optimizer it goes to.
  std::string optimizer;
  /// Every field of the config after the rules.
  std::map<std::string, FieldValue> values;
  /// Labels of the rules that matched, in order.
  std::vector<std::string> rules;
  /// The name of the first parameter that is the same tensor (tied weights;
  /// this one is then not optimized twice), or empty.
  std::string alias_of;
  /// Index of the param group of the composite optimizer (-1 for aliases).
  int64_t group = -1;
};

/// Resolves every parameter of `named_parameters` under `config`: the
/// registry's default rules for config's optimizer, then the user's, later
/// rules winning. A user rule that matches no parameter raises
/// c10::ValueError (a typo in a pattern must not pass silently); so does a
/// resolved optimizer that is not registered.
std::vector<ResolvedParameter> resolve_parameters(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    const OptimizerConfig& config, const OptimizerRegistry& registry = OptimizerRegistry::global());

/// One line per parameter: name, shape, optimizer, group, the settings that
/// optimizer reads that differ from the config's own values, and the rules
/// that matched.
std::string explain(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                    const OptimizerConfig& config,
                    const OptimizerRegistry& registry = OptimizerRegistry::global());

/// Builds the optimizer that `config` describes over `named_parameters`:
/// parameters with identical resolved settings share a param group, each
/// optimizer gets the groups of its parameters, and the result presents them
/// all as one (a CompositeOptimizer with one part per optimizer used, in
/// registry order), with save/load and LR schedulers working across them.
/// Errors (c10::ValueError): an unknown optimizer, rules that match nothing,
/// invalid settings for a parameter (the optimizer's own checks), settings
/// an extension's check rejects (with the global registry: a muon_tp_mode
/// other than "duplicated", since tensor-parallel layouts need the process
/// groups: muon::distributed::make_optimizer in muon/distributed/layouts/make.h).
std::unique_ptr<CompositeOptimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    const OptimizerConfig& config, const OptimizerRegistry& registry = OptimizerRegistry::global());

/// What `make_optimizer` needs beyond the config when it builds part of a
/// larger optimizer (the distributed layouts in muon/distributed/layouts/make.h use it).
struct BuildContext {
  /// Building over a subset of a model's parameters (e.g. those one rank
  /// owns): a user rule that matches none of them is not an error.
  bool allow_unmatched_rules = false;
  /// Entry name → a factory used instead of the entry's own (e.g. "muon" →
  /// a tensor-parallel or sharded Muon over the same groups and options).
  std::map<std::string, std::function<std::unique_ptr<torch::optim::Optimizer>(
                            std::vector<torch::optim::OptimizerParamGroup> groups,
                            const std::vector<OptimizerSettings>& settings)>>
      factories;
  /// For the weight-update hooks of a layout that splits matrices: sums
  /// each parameter's partial norms over the processes holding its other
  /// parts (muon/optim/weight_update_hook.h). Absent: parameters are whole.
  SumAcrossParts sum_across_parts;
};

/// `make_optimizer` with a build context. Raises c10::ValueError for a
/// context factory of an unregistered name, and as the other overload.
std::unique_ptr<CompositeOptimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
    const OptimizerConfig& config, const BuildContext& context,
    const OptimizerRegistry& registry = OptimizerRegistry::global());

/// An optimizer that keeps per-parameter state, and the registry entry that
/// describes it.
struct StateHolder {
  torch::optim::Optimizer* optimizer = nullptr;
  std::shared_ptr<const OptimizerEntry> entry;
};

/// Every optimizer that keeps the per-parameter state of `optimizer`: itself,
/// or the inner optimizers of those that implement muon::InnerOptimizers
/// (composites, the layer-wise layout), in order. Raises c10::ValueError
/// naming the type of one whose state no registered schema describes (`who`
/// prefixes the message).
std::vector<StateHolder> state_holders(torch::optim::Optimizer& optimizer, const std::string& who,
                                       const OptimizerRegistry& registry = OptimizerRegistry::global());

/// The LR schedule a config describes: lr, min_lr, lr_warmup_steps,
/// lr_warmup_init, lr_decay_steps, lr_decay_style.
LrScheduleOptions lr_schedule_options(const OptimizerConfig& config);

}  // namespace muon
