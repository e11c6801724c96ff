// The layouts of --parallel: groups, and how each steps the model.
#include "layouts.h"

#include <c10/util/Exception.h>

#include <memory>
#include <utility>

#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/runtime/agreement.h"

namespace train_gpt {
namespace {

struct Named {
  Parallel value;
  const char* name;
};
constexpr Named kNames[] = {{Parallel::kSingle, "single"},
                            {Parallel::kDdp, "ddp"},
                            {Parallel::kSharded, "sharded"},
                            {Parallel::kTensorParallel, "tp"},
                            {Parallel::kTensorSharded, "tp,sharded"}};

bool tensor_parallel(Parallel p) {
  return p == Parallel::kTensorParallel || p == Parallel::kTensorSharded;
}

}  // namespace

std::string to_string(Parallel parallel) {
  for (const auto& n : kNames) {
    if (n.value == parallel) return n.name;
  }
  return "?";
}

Parallel parse_parallel(const std::string& name) {
  std::string valid;
  for (const auto& n : kNames) {
    if (name == n.name) return n.value;
    valid += std::string(valid.empty() ? "" : " | ") + n.name;
  }
  TORCH_CHECK_VALUE(false, "[muon-train-gpt] --parallel must be one of ", valid, ", got '",
                    name.substr(0, 40), "'");
}

const std::vector<Parallel>& all_parallel() {
  static const std::vector<Parallel> all{Parallel::kSingle, Parallel::kDdp, Parallel::kSharded,
                                         Parallel::kTensorParallel, Parallel::kTensorSharded};
  return all;
}

int tensor_parallel_size(Parallel parallel, int world, int tp, int64_t heads) {
  TORCH_CHECK_VALUE(parallel != Parallel::kSingle || world == 1,
                    "[muon-train-gpt] --parallel single runs one process, got ", world, " ranks");
  if (!tensor_parallel(parallel)) {
    TORCH_CHECK_VALUE(tp <= 1, "[muon-train-gpt] --tp ", tp, " needs --parallel tp or tp,sharded, got --parallel ",
                      to_string(parallel));
    return 1;
  }
  const int size = tp > 0 ? tp : parallel == Parallel::kTensorParallel ? world : std::min(world, 2);
  TORCH_CHECK_VALUE(size >= 1 && world % size == 0, "[muon-train-gpt] --tp ", size,
                    " must divide the number of ranks ", world);
  TORCH_CHECK_VALUE(heads >= size, "[muon-train-gpt] --tp ", size,
                    " splits the attention by heads; the model has --heads ", heads);
  return size;
}

Mesh make_mesh(Parallel parallel, const muon::distributed::Group& world, int tp_size) {
  Mesh m;
  m.world = world;
  m.distinct = {world};
  if (!tensor_parallel(parallel)) {
    m.dp = world;
    m.tp = muon::distributed::Group::single();
    return m;
  }
  std::tie(m.dp, m.tp) = world.mesh(world.size() / tp_size, tp_size);
  m.distinct.push_back(m.dp);
  m.distinct.push_back(m.tp);
  return m;
}

std::string describe(Parallel parallel, const Mesh& mesh, const std::string& optimizer_layout) {
  switch (parallel) {
    case Parallel::kSingle:
      return "single process";
    case Parallel::kDdp:
      if (mesh.world.size() == 1) return "single process";
      return optimizer_layout == "layerwise" ? "layer-wise" : "replicated";
    case Parallel::kSharded:
      return "sharded";
    case Parallel::kTensorParallel:
      return "tensor parallel " + std::to_string(mesh.tp.size());
    case Parallel::kTensorSharded:
      return "2-D " + std::to_string(mesh.dp.size()) + " x " + std::to_string(mesh.tp.size());
  }
  return "?";
}

std::unique_ptr<muon::distributed::Layout> make_layout(Parallel parallel, const Mesh& mesh, Gpt& model,
                                                muon::OptimizerConfig config,
                                                const std::string& optimizer_layout) {
  // Replicas start equal, as DDP makes them: the data-parallel rank 0's
  // parameters (a rank started with another --seed trains the same model).
  muon::distributed::broadcast_parameters(model->named_parameters(), mesh.dp);
  auto groups = muon::distributed::LayoutGroups().world(mesh.world).dp(mesh.dp);
  switch (parallel) {
    case Parallel::kSingle:
    case Parallel::kDdp:
      if (mesh.world.size() > 1 && optimizer_layout == "layerwise") config.set("layout", "layerwise");
      break;
    case Parallel::kTensorParallel:
      groups.tensor_parallel(model->tensor_parallel_shards());
      config.set("layout", "tensor_parallel");
      break;
    case Parallel::kSharded:
    case Parallel::kTensorSharded:
      groups.tensor_parallel(model->tensor_parallel_shards());
      config.set("layout", "sharded");
      break;
  }
  return std::make_unique<muon::distributed::Layout>(model->named_parameters(), config, groups);
}

}  // namespace train_gpt
