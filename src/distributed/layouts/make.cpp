// make_optimizer for the distributed layouts.
#include "muon/distributed/layouts/make.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distributed/runtime/agreement.h"
#include "hook_sums.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/sharded_dion.h"
#include "muon/distributed/layouts/sharded_dion2.h"
#include "muon/distributed/layouts/sharded_iso.h"
#include "muon/distributed/layouts/sharded_kl_soap.h"
#include "muon/distributed/layouts/sharded_moso.h"
#include "muon/distributed/layouts/sharded_psgd_pro.h"
#include "muon/distributed/layouts/sharded_soap.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_dion.h"
#include "muon/distributed/layouts/tensor_parallel_kl_soap.h"
#include "muon/optim/muon.h"
#include "registry_internal.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::make_optimizer] ";

using torch::optim::OptimizerParamGroup;

// Tensor → name, for messages and for finding each parameter's shard.
std::unordered_map<const void*, std::string> names_of(
    const torch::OrderedDict<std::string, at::Tensor>& named) {
  std::unordered_map<const void*, std::string> out;
  for (const auto& item : named) out.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return out;
}

template <typename Shard>
void check_names(const std::map<std::string, Shard>& shards,
                 const torch::OrderedDict<std::string, at::Tensor>& named, const char* what) {
  for (const auto& item : shards) {
    TORCH_CHECK_VALUE(named.find(item.first) != nullptr, kWho, what, " names parameter '",
                      item.first, "', which is not among the parameters given");
  }
}

// The factories of a layout whose strategy comes from `Options`
// (TensorParallelOptions or ShardedOptions) built per set of groups: Muon's
// (TensorParallelMuon / ShardedMuon), and every other Muon-family entry's
// (adaptive_muon, polargrad, ...: those with a strategy_factory) with the
// same strategy.
template <typename Options, typename MuonOfLayout>
void add_strategy_factories(
    BuildContext& context, const OptimizerRegistry& registry,
    std::function<Options(const std::vector<OptimizerParamGroup>&, const std::vector<OptimizerSettings>&)>
        options_for) {
  context.factories["muon"] = [options_for](std::vector<OptimizerParamGroup> groups,
                                            const std::vector<OptimizerSettings>& settings) {
    auto options = options_for(groups, settings);
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<MuonOfLayout>(std::move(groups), defaults, std::move(options)));
  };
  for (const auto& name : registry.keys()) {
    const auto entry = registry.at(name);
    if (name == "muon" || !entry->strategy_factory) continue;
    context.factories[name] = [options_for, entry](std::vector<OptimizerParamGroup> groups,
                                                   const std::vector<OptimizerSettings>& settings) {
      auto strategy = make_orthogonalizer(options_for(groups, settings));
      return entry->strategy_factory(std::move(groups), settings, std::move(strategy));
    };
  }
}

// Makes building `name` raise c10::ValueError "<kWho>optimizer '<name>' <why>".
void refuse(BuildContext& context, const std::string& name, std::string why) {
  context.factories[name] = [name, why = std::move(why)](
                                std::vector<OptimizerParamGroup>,
                                const std::vector<OptimizerSettings>&) -> std::unique_ptr<torch::optim::Optimizer> {
    TORCH_CHECK_VALUE(false, kWho, "optimizer '", name, "' ", why);
  };
}

// Optimizers that need each parameter's whole matrix and have no strategy
// for the layout `kind` (tensor_parallel): building one raises, naming it
// and the layout.
void refuse_whole_matrix_optimizers(BuildContext& context, const std::string& kind) {
  const std::string splits =
      " whole matrices and does not run in layout '" + kind + "', which splits them; use layout ";
  const std::string owner_compute = "'sharded' (owner-compute), 'layerwise' (or 'none')";
  refuse(context, "soap", "preconditions" + splits + owner_compute);
  for (const auto& [name, needs] : {std::make_pair("iso", "factorizes"),
                                    std::make_pair("psgd_pro", "preconditions"),
                                    std::make_pair("moso", "preconditions"), std::make_pair("kl_soap", "preconditions"),
                                    std::make_pair("kl_m_soap", "preconditions"), std::make_pair("rekls", "preconditions"),
                                    std::make_pair("rekls_v3", "preconditions"), std::make_pair("tp_rekls", "preconditions"),
                                    std::make_pair("stacked_soap", "preconditions")}) {
    refuse(context, name, needs + splits + "'sharded', 'layerwise' (or 'none')");
  }
  for (const char* name : {"dion2", "nordion2"}) {
    refuse(context, name, "selects rows or columns of" + splits + owner_compute);
  }
}

// Optimizers that normalize slices of each parameter along an option `dim`
// (oblique_sgd, oblique_adam): the layout `kind` (tensor_parallel, sharded)
// splits parameters, so a slice's norm would span ranks; building one
// raises, naming it and the layout.
void refuse_normalizing_optimizers(BuildContext& context, const std::string& kind) {
  for (const char* name : {"oblique_sgd", "oblique_adam"}) {
    refuse(context, name,
           "normalizes whole slices of each parameter along its dim and does not run in layout '" + kind +
               "', which splits parameters; use layout 'layerwise' (or 'none')");
  }
}

// A whole-matrix optimizer over tensor-parallel blocks (TensorParallelKlSoap,
// TensorParallelDion over Options), the blocks of its groups' parameters
// from `tp` by name; the others whole.
template <typename Opt, typename Options>
auto tp_blocks_factory(const std::map<std::string, TensorParallelShard>& tp,
                       const std::unordered_map<const void*, std::string>& names) {
  return [tp, names](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>&) {
    std::unordered_map<const void*, TensorParallelShard> shards;
    for (const auto& g : groups) {
      for (const auto& p : g.params()) {
        const auto it = tp.find(names.at(p.unsafeGetTensorImpl()));
        if (it != tp.end()) shards.emplace(p.unsafeGetTensorImpl(), it->second);
      }
    }
    const auto defaults = static_cast<const Options&>(groups.at(0).options());
    auto opt = std::make_unique<Opt>(groups, defaults, std::move(shards));
    compat::reapply_group_options(*opt, groups);
    return std::unique_ptr<torch::optim::Optimizer>(std::move(opt));
  };
}

// The factory of optimizer `name` by owner-compute (Sharded over Options),
// its row shards from `shards(groups, name)`; refused where a row shard has
// tensor-parallel blocks, which split the whole matrices it `needs`.
template <typename Sharded, typename Options, typename Shards>
auto owner_compute_factory(Shards shards, std::string name, std::string needs) {
  return [shards, name, needs](std::vector<OptimizerParamGroup> groups,
                               const std::vector<OptimizerSettings>&) {
    auto options = shards(groups, name.c_str());
    for (const auto& entry : options.shards()) {
      TORCH_CHECK_VALUE(!entry.second.has_tensor_parallel(), kWho, "optimizer '", name, "' ", needs,
                        " and does not run in the 2-D layout (sharded with tensor_parallel "
                        "blocks), which splits them across tensor-parallel ranks; use layout "
                        "'sharded' without tensor_parallel, 'layerwise' (or 'none')");
    }
    const auto defaults = static_cast<const Options&>(groups.at(0).options());
    auto opt = std::make_unique<Sharded>(groups, defaults, std::move(options));
    compat::reapply_group_options(*opt, groups);
    return std::unique_ptr<torch::optim::Optimizer>(std::move(opt));
  };
}

// The layer-wise layout's options from the config's layout fields.
LayerwiseOptions layerwise_options(const OptimizerConfig& config) {
  const auto bucket = static_cast<int64_t>(config.get_double("layout_bucket_mb") * (1 << 20));
  return LayerwiseOptions()
      .bucket_bytes(std::max<int64_t>(bucket, 1))
      .max_in_flight(config.get_int("layout_max_in_flight"));
}

// The factories that replace Muon's and AdaptiveMuon's for the
// tensor_parallel and sharded layouts (none for the others): they hold the
// layout's strategy; the other optimizers are element-wise and run on the
// local blocks or shards as they are.
BuildContext layout_context(const torch::OrderedDict<std::string, at::Tensor>& named,
                            const OptimizerConfig& config, const DistributedLayout& layout,
                            const OptimizerRegistry& registry) {
  const auto& kind = config.get_string("layout");
  BuildContext context;
  const auto names = names_of(named);
  context.sum_across_parts = detail::hook_sums(layout, names);
  if (kind == "tensor_parallel") {
    refuse_whole_matrix_optimizers(context, kind);
    refuse_normalizing_optimizers(context, kind);
    check_names(layout.tensor_parallel, named, "DistributedLayout::tensor_parallel");
    // The KL-SOAP family but stacked_soap (3-D stacks) steps gathered blocks (TpRekls).
    for (const char* name : {"kl_soap", "kl_m_soap", "rekls", "tp_rekls", "rekls_v3"}) {
      context.factories[name] = tp_blocks_factory<TensorParallelKlSoap, KlSoapOptions>(layout.tensor_parallel, names);
    }
    // Dion exchanges the low-rank factors of the blocks (Dion's inner shard mesh).
    context.factories["dion"] = tp_blocks_factory<TensorParallelDion, DionOptions>(layout.tensor_parallel, names);
    add_strategy_factories<TensorParallelOptions, TensorParallelMuon>(
        context, registry, [&layout, names](const std::vector<OptimizerParamGroup>& groups,
                                  const std::vector<OptimizerSettings>& settings) {
          const auto& mode = settings.at(0).get_string("tp_mode");
          for (const auto& s : settings) {
            TORCH_CHECK_VALUE(s.get_string("tp_mode") == mode, kWho,
                              "muon_tp_mode must be the same for every Muon parameter, got '", mode,
                              "' and '", s.get_string("tp_mode"), "'");
          }
          TensorParallelOptions tp;
          tp.mode(mode);
          for (const auto& g : groups) {
            for (const auto& p : g.params()) {
              const auto it = layout.tensor_parallel.find(names.at(p.unsafeGetTensorImpl()));
              if (it != layout.tensor_parallel.end()) tp.shard(p, it->second);
            }
          }
          return tp;
        });
    return context;
  }

  if (kind != "sharded") return context;
  refuse_normalizing_optimizers(context, kind);
  check_names(layout.row_shards, named, "DistributedLayout::row_shards");
  const auto mode = config.get_string("layout_sharded_mode");
  const auto in_flight = config.get_int("layout_max_in_flight");
  // The row shards of `groups`' parameters, which go to `optimizer`.
  const auto sharded_options = [&layout, names, mode, in_flight](const std::vector<OptimizerParamGroup>& groups,
                                                                const char* optimizer) {
    ShardedOptions sharded;
    sharded.mode(mode).max_in_flight(in_flight);
    for (const auto& g : groups) {
      for (const auto& p : g.params()) {
        const auto& name = names.at(p.unsafeGetTensorImpl());
        const auto it = layout.row_shards.find(name);
        TORCH_CHECK_VALUE(it != layout.row_shards.end(), kWho, "parameter '", name, "' goes to ", optimizer,
                          " but DistributedLayout::row_shards has no RowShard for it");
        sharded.shard(p, it->second);
      }
    }
    return sharded;
  };
  add_strategy_factories<ShardedOptions, ShardedMuon>(
      context, registry, [sharded_options](const std::vector<OptimizerParamGroup>& groups,
                                           const std::vector<OptimizerSettings>& settings) {
        for (const auto& s : settings) {
          TORCH_CHECK_VALUE(s.get_string("tp_mode") == "duplicated", kWho,
                            "muon_tp_mode '", s.get_string("tp_mode"),
                            "' needs TP blocks in the row shards (RowShard::tensor_parallel), which "
                            "set their own mode; leave muon_tp_mode at 'duplicated'");
        }
        return sharded_options(groups, "Muon");
      });
  // SOAP, the KL-SOAP family, Dion, Iso, MOSO, Dion2 and NorDion2
  // (ShardedSoap, ShardedKlSoap, ShardedDion, ShardedIso, ShardedMoso, ShardedDion2);
  // the 2-D layout's tensor-parallel blocks split their matrices, which they
  // refuse as the tensor_parallel layout does.
  context.factories["soap"] = owner_compute_factory<ShardedSoap, SoapOptions>(
      sharded_options, "soap", "preconditions whole matrices");
  context.factories["dion"] = owner_compute_factory<ShardedDion, DionOptions>(
      sharded_options, "dion", "orthonormalizes whole matrices");
  context.factories["iso"] = owner_compute_factory<ShardedIso, IsoOptions>(sharded_options, "iso",
                                                                           "factorizes whole matrices");
  context.factories["moso"] = owner_compute_factory<ShardedMoso, MosoOptions>(sharded_options, "moso",
                                                                             "preconditions whole matrices");
  context.factories["psgd_pro"] = owner_compute_factory<ShardedPsgdPro, PsgdProOptions>(
      sharded_options, "psgd_pro", "preconditions whole matrices");
  for (const char* name : {"kl_soap", "kl_m_soap", "rekls", "tp_rekls", "rekls_v3", "stacked_soap"}) {
    context.factories[name] = owner_compute_factory<ShardedKlSoap, KlSoapOptions>(sharded_options, name,
                                                                                  "preconditions whole matrices");
  }
  for (const char* name : {"dion2", "nordion2"}) {
    context.factories[name] = owner_compute_factory<ShardedDion2, Dion2Options>(
        sharded_options, name, "selects rows or columns of whole matrices");
  }
  return context;
}

}  // namespace

void register_config_fields(OptimizerRegistry& registry) {
  ConfigExtension x;
  x.name = "muon::distributed";
  x.common_fields = {
      FieldSpec::text("layout", "none",
                      "distributed layout (muon::distributed::make_optimizer): none | tensor_parallel | "
                      "sharded | layerwise",
                      {"none", "tensor_parallel", "sharded", "layerwise"})
          .whole_run(),
      FieldSpec::text("layout_sharded_mode", "owner_compute",
                      "sharded layout: one owner orthogonalizes each matrix, or every rank all",
                      {"owner_compute", "replicated"})
          .whole_run(),
      FieldSpec::integer("layout_max_in_flight", 2,
                         "sharded and layerwise layouts: collectives in flight while computing "
                         "(0: no overlap)",
                         0.0)
          .whole_run(),
      FieldSpec::real("layout_bucket_mb", 8.0,
                      "layerwise layout: MB of updated parameters per all-gather bucket", 0.0)
          .exclusive_min()
          .whole_run(),
  };
  x.option_fields["muon"] = {
      FieldSpec::text("tp_mode", "duplicated",
                      "tensor-parallel orthogonalization (only duplicated without TP)",
                      {"duplicated", "distributed", "blockwise"}),
  };
  // Without a layout that replaces Muon's factory there is no tensor
  // parallelism: only "duplicated" (plain Muon) can be built.
  x.check_own_factory = [](const std::string&, const OptimizerSettings& s) {
    TORCH_CHECK_VALUE(!s.has("tp_mode") || s.get_string("tp_mode") == "duplicated",
                      "muon_tp_mode '", s.get_string("tp_mode"),
                      "' needs a tensor-parallel layout (layout tensor_parallel through "
                      "muon::distributed::make_optimizer); single-process Muon is 'duplicated'");
  };
  registry.extend(std::move(x));
}

namespace {

// The layouts' fields exist in every config of the global registry whenever
// this layer is linked: added when the registry is created (at once when it
// already is), so that the core names nothing of this layer.
const struct RegisterWithGlobal {
  RegisterWithGlobal() { OptimizerRegistry::extend_global(register_config_fields); }
} register_with_global;

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const DistributedLayout& layout, const OptimizerRegistry& registry) {
  // The same config on every rank first: a difference is then named as the
  // field the user set, before any layout compares what it built from it.
  if (layout.group.valid()) {
    check_ranks_agree(layout.group, detail::config_items(config), kWho,
                      "every rank must build its optimizer from the same config");
  }
  const auto& kind = config.get_string("layout");
  if (kind == "none") return muon::make_optimizer(named, config, registry);

  if (kind == "layerwise") {
    TORCH_CHECK_VALUE(layout.group.valid(), kWho,
                      "layout 'layerwise' needs DistributedLayout::group (the data-parallel group)");
    auto optimizer = std::make_unique<LayerwiseOptimizer>(
        named, layout.group,
        [config, &registry](const torch::OrderedDict<std::string, at::Tensor>& owned) {
          BuildContext context;
          context.allow_unmatched_rules = true;  // a rank owns a subset
          return muon::make_optimizer(owned, config, context, registry);
        },
        layerwise_options(config));
    optimizer->set_nonfinite(parse_nonfinite_policy(config.get_string("nonfinite")));
    return optimizer;
  }

  return muon::make_optimizer(named, config, layout_context(named, config, layout, registry), registry);
}

namespace {

// Those of `groups`' parameters that pass `keep`, as the registry's group
// plans (a group left with none is left out; index maps plans to groups).
std::vector<muon::detail::ParamGroupPlan> plans_of(const std::vector<GroupSpec>& groups,
                                                   const std::vector<OptimizerSettings>& settings,
                                                   const std::function<bool(const at::Tensor&)>& keep,
                                                   std::vector<size_t>& index) {
  std::vector<muon::detail::ParamGroupPlan> plans;
  index.clear();
  for (const auto i : c10::irange(groups.size())) {
    muon::detail::ParamGroupPlan plan;
    plan.optimizer = groups[i].optimizer;
    for (const auto j : c10::irange(groups[i].params.size())) {
      if (!keep(groups[i].params[j])) continue;
      plan.params.push_back(groups[i].params[j]);
      plan.names.push_back(groups[i].names[j]);
    }
    if (plan.params.empty()) continue;
    plan.settings = std::make_unique<OptimizerSettings>(settings[i]);
    plans.push_back(std::move(plan));
    index.push_back(i);
  }
  return plans;
}

// The composite over the parameters of `groups` that pass `keep`; out[i] is
// group i's place in it or -1.
std::unique_ptr<CompositeOptimizer> build_groups(
    const std::vector<GroupSpec>& groups, const std::vector<OptimizerSettings>& settings,
    const std::function<bool(const at::Tensor&)>& keep, const BuildContext& context,
    const OptimizerRegistry& registry, std::vector<int64_t>& out) {
  std::vector<size_t> source;
  const auto plans = plans_of(groups, settings, keep, source);
  std::vector<int64_t> index;
  auto composite = muon::detail::build_composite(
      plans, context, registry, kWho,
      [&](size_t k) { return "param group " + std::to_string(source[k]) + " (" + plans[k].optimizer + ")"; },
      index);
  out.assign(groups.size(), -1);
  for (const auto k : c10::irange(plans.size())) out[source[k]] = index[k];
  return composite;
}

}  // namespace

GroupedOptimizer make_grouped_optimizer(const std::vector<GroupSpec>& groups,
                                        const OptimizerConfig& config,
                                        const DistributedLayout& layout,
                                        const OptimizerRegistry& registry) {
  TORCH_CHECK_VALUE(!groups.empty(), kWho, "no param groups given");
  torch::OrderedDict<std::string, at::Tensor> named;
  std::set<const c10::TensorImpl*> seen;
  std::vector<OptimizerSettings> settings;
  for (const auto i : c10::irange(groups.size())) {
    const auto& g = groups[i];
    TORCH_CHECK_VALUE(g.names.size() == g.params.size(), kWho, "param group ", i, " has ",
                      g.params.size(), " parameters but ", g.names.size(), " names");
    try {
      settings.push_back(group_settings(g.optimizer, g.settings, config, registry));
    } catch (const c10::ValueError& e) {
      TORCH_CHECK_VALUE(false, kWho, "param group ", i, ": ", e.what_without_backtrace());
    }
    for (const auto j : c10::irange(g.params.size())) {
      TORCH_CHECK_VALUE(g.params[j].defined(), kWho, "param group ", i, ": parameter '",
                        g.names[j], "' is undefined");
      TORCH_CHECK_VALUE(seen.insert(g.params[j].unsafeGetTensorImpl()).second, kWho,
                        "parameter '", g.names[j], "' (param group ", i,
                        ") appears twice; give each tensor once");
      TORCH_CHECK_VALUE(named.find(g.names[j]) == nullptr, kWho, "two parameters are named '",
                        g.names[j], "'");
      named.insert(g.names[j], g.params[j]);
    }
  }
  if (layout.group.valid()) {
    check_ranks_agree(layout.group, detail::config_items(config), kWho,
                      "every rank must build its optimizer from the same config");
  }
  GroupedOptimizer out;
  const auto all = [](const at::Tensor&) { return true; };
  const auto policy = parse_nonfinite_policy(config.get_string("nonfinite"));
  if (config.get_string("layout") != "layerwise") {
    auto composite = build_groups(groups, settings, all, layout_context(named, config, layout, registry),
                                  registry, out.group_index);
    composite->set_nonfinite(policy);
    out.optimizer = std::move(composite);
    return out;
  }
  TORCH_CHECK_VALUE(layout.group.valid(), kWho,
                    "layout 'layerwise' needs DistributedLayout::group (the data-parallel group)");
  std::vector<int64_t> index;
  auto optimizer = std::make_unique<LayerwiseOptimizer>(
      named, layout.group,
      [&](const torch::OrderedDict<std::string, at::Tensor>& owned) {
        // `owned` holds the owned parameters by name: the parameters
        // themselves, or copies (the settings probe); the groups take them.
        std::set<const c10::TensorImpl*> mine;
        for (const auto& item : owned) mine.insert(item.value().unsafeGetTensorImpl());
        auto taken = groups;
        for (auto& g : taken) {
          for (const auto j : c10::irange(g.names.size())) {
            if (const auto* t = owned.find(g.names[j])) g.params[j] = *t;
          }
        }
        return std::unique_ptr<torch::optim::Optimizer>(build_groups(
            taken, settings,
            [&mine](const at::Tensor& p) { return mine.count(p.unsafeGetTensorImpl()) != 0; },
            BuildContext(), registry, index));
      },
      layerwise_options(config));
  optimizer->set_nonfinite(policy);
  // The factory's last call built the inner optimizer (the first probes all
  // parameters); without owned parameters there is none.
  if (optimizer->inner() == nullptr) index.assign(groups.size(), -1);
  out.group_index = std::move(index);
  out.optimizer = std::move(optimizer);
  return out;
}

}  // namespace muon::distributed
