// Checkpoints of a muon::distributed::Layout: its checkpoint view, over its world.
#include "muon/distributed/checkpoints/checkpoint.h"

namespace muon::distributed {
namespace {

CheckpointOptions over_world(const Layout& layout, CheckpointOptions options) {
  if (!options.group().valid()) options.group(layout.world());
  return options;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, Layout& layout, int64_t step,
                            const std::string& extra, const CheckpointOptions& options) {
  return save_checkpoint(dir, layout.checkpoint_parameters(), layout.optimizer(), step,
                         layout.checkpoint_layout(), extra, over_world(layout, options));
}

CheckpointInfo load_checkpoint(const std::string& path, Layout& layout,
                               const CheckpointOptions& options) {
  auto info = load_checkpoint(path, layout.checkpoint_parameters(), layout.optimizer(),
                              layout.checkpoint_layout(), over_world(layout, options));
  layout.parameters_loaded();
  return info;
}

}  // namespace muon::distributed
