// make_optimizer for the distributed layouts.
#include "muon/distributed/make.h"

#include <c10/util/Exception.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distributed/agreement.h"
#include "muon/distributed/layerwise.h"
#include "muon/distributed/sharded.h"
#include "muon/distributed/tensor_parallel.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/muon.h"
#include "registry_internal.h"

namespace muon::dist {
namespace {

constexpr const char* kWho = "[muon::dist::make_optimizer] ";

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

// The Muon and AdaptiveMuon factories of a layout whose strategy comes from
// `Options` (TensorParallelOptions or ShardedOptions) built per set of groups.
template <typename Options, typename MuonOfLayout>
void add_strategy_factories(
    BuildContext& context,
    std::function<Options(const std::vector<OptimizerParamGroup>&, const std::vector<OptimizerSettings>&)>
        options_for) {
  context.factories["muon"] = [options_for](std::vector<OptimizerParamGroup> groups,
                                            const std::vector<OptimizerSettings>& settings) {
    auto options = options_for(groups, settings);
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<MuonOfLayout>(std::move(groups), defaults, std::move(options)));
  };
  context.factories["adaptive_muon"] = [options_for](std::vector<OptimizerParamGroup> groups,
                                                     const std::vector<OptimizerSettings>& settings) {
    auto strategy = make_orthogonalizer(options_for(groups, settings));
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<AdaptiveMuon>(
        std::move(groups), defaults, muon::detail::adaptive_muon_options(settings.at(0)),
        std::move(strategy)));
  };
}

}  // namespace

void register_config_fields(OptimizerRegistry& registry) {
  ConfigExtension x;
  x.name = "muon::dist";
  x.common_fields = {
      FieldSpec::text("layout", "none",
                      "distributed layout (muon::dist::make_optimizer): none | tensor_parallel | "
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
                      "muon::dist::make_optimizer); single-process Muon is 'duplicated'");
  };
  registry.extend(std::move(x));
}

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
    const auto bucket = static_cast<int64_t>(config.get_double("layout_bucket_mb") * (1 << 20));
    auto optimizer = std::make_unique<LayerwiseOptimizer>(
        named, layout.group,
        [config, &registry](const torch::OrderedDict<std::string, at::Tensor>& owned) {
          BuildContext context;
          context.allow_unmatched_rules = true;  // a rank owns a subset
          return muon::make_optimizer(owned, config, context, registry);
        },
        LayerwiseOptions().bucket_bytes(std::max<int64_t>(bucket, 1)).max_in_flight(config.get_int("layout_max_in_flight")));
    optimizer->set_nonfinite(parse_nonfinite_policy(config.get_string("nonfinite")));
    return optimizer;
  }

  // Muon and adaptive_muon hold the layout's strategy; the other optimizers
  // are element-wise and run on the local blocks or shards as they are.
  BuildContext context;
  const auto names = names_of(named);
  if (kind == "tensor_parallel") {
    check_names(layout.tensor_parallel, named, "DistributedLayout::tensor_parallel");
    add_strategy_factories<TensorParallelOptions, TensorParallelMuon>(
        context, [&layout, names](const std::vector<OptimizerParamGroup>& groups,
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
    return muon::make_optimizer(named, config, context, registry);
  }

  TORCH_CHECK_VALUE(kind == "sharded", kWho, "unknown layout '", kind, "'");
  check_names(layout.row_shards, named, "DistributedLayout::row_shards");
  const auto mode = config.get_string("layout_sharded_mode");
  const auto in_flight = config.get_int("layout_max_in_flight");
  add_strategy_factories<ShardedOptions, ShardedMuon>(
      context, [&layout, names, mode, in_flight](const std::vector<OptimizerParamGroup>& groups,
                                                 const std::vector<OptimizerSettings>& settings) {
        for (const auto& s : settings) {
          TORCH_CHECK_VALUE(s.get_string("tp_mode") == "duplicated", kWho,
                            "muon_tp_mode '", s.get_string("tp_mode"),
                            "' needs TP blocks in the row shards (RowShard::tensor_parallel), which "
                            "set their own mode; leave muon_tp_mode at 'duplicated'");
        }
        ShardedOptions sharded;
        sharded.mode(mode).max_in_flight(in_flight);
        for (const auto& g : groups) {
          for (const auto& p : g.params()) {
            const auto& name = names.at(p.unsafeGetTensorImpl());
            const auto it = layout.row_shards.find(name);
            TORCH_CHECK_VALUE(it != layout.row_shards.end(), kWho, "parameter '", name,
                              "' goes to Muon but DistributedLayout::row_shards has no RowShard "
                              "for it");
            sharded.shard(p, it->second);
          }
        }
        return sharded;
      });
  return muon::make_optimizer(named, config, context, registry);
}

}  // namespace muon::dist
