// make_optimizer for the distributed layouts.
#include "muon/distributed/make.h"

#include <c10/util/Exception.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "muon/distributed/layerwise.h"
#include "muon/distributed/tensor_parallel.h"
#include "muon/optim/muon.h"

namespace muon::dist {
namespace {

constexpr const char* kWho = "[muon::dist::make_optimizer] ";

using torch::optim::OptimizerParamGroup;
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    std::vector<OptimizerParamGroup>, const std::vector<OptimizerSettings>&)>;

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

Factory unsupported(const std::string& optimizer, const std::string& layout) {
  return [optimizer, layout](std::vector<OptimizerParamGroup>, const std::vector<OptimizerSettings>&)
             -> std::unique_ptr<torch::optim::Optimizer> {
    TORCH_CHECK_VALUE(false, kWho, "optimizer '", optimizer, "' does not support layout '", layout,
                      "' (its state would be computed on shards); use layout layerwise or none");
  };
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const DistributedLayout& layout, const OptimizerRegistry& registry) {
  const auto& kind = config.get_string("layout");
  if (kind == "none") return muon::make_optimizer(named, config, registry);

  if (kind == "layerwise") {
    TORCH_CHECK_VALUE(layout.group.valid(), kWho,
                      "layout 'layerwise' needs DistributedLayout::group (the data-parallel group)");
    const auto bucket = static_cast<int64_t>(config.get_double("layout_bucket_mb") * (1 << 20));
    return std::make_unique<LayerwiseOptimizer>(
        named, layout.group,
        [config, &registry](const torch::OrderedDict<std::string, at::Tensor>& owned) {
          BuildContext context;
          context.allow_unmatched_rules = true;  // a rank owns a subset
          return muon::make_optimizer(owned, config, context, registry);
        },
        LayerwiseOptions().bucket_bytes(std::max<int64_t>(bucket, 1)).max_in_flight(config.get_int("layout_max_in_flight")));
  }

  BuildContext context;
  context.factories["adaptive_muon"] = unsupported("adaptive_muon", kind);
  const auto names = names_of(named);
  if (kind == "tensor_parallel") {
    check_names(layout.tensor_parallel, named, "DistributedLayout::tensor_parallel");
    context.factories["muon"] = [&layout, names](std::vector<OptimizerParamGroup> groups,
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
      const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
      return std::unique_ptr<torch::optim::Optimizer>(
          std::make_unique<TensorParallelMuon>(std::move(groups), defaults, tp));
    };
    return muon::make_optimizer(named, config, context, registry);
  }

  TORCH_CHECK_VALUE(kind == "sharded", kWho, "unknown layout '", kind, "'");
  check_names(layout.row_shards, named, "DistributedLayout::row_shards");
  const auto mode = config.get_string("layout_sharded_mode");
  const auto in_flight = config.get_int("layout_max_in_flight");
  context.factories["muon"] = [&layout, names, mode, in_flight](
                                  std::vector<OptimizerParamGroup> groups,
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
                          "' goes to Muon but DistributedLayout::row_shards has no RowShard for it");
        sharded.shard(p, it->second);
      }
    }
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<ShardedMuon>(std::move(groups), defaults, sharded));
  };
  return muon::make_optimizer(named, config, context, registry);
}

}  // namespace muon::dist
