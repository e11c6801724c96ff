// Gloo backend: collectives over TCP between CPU tensors.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "distributed/runtime/backend.h"

namespace muon::distributed::detail {

compat::BackendPtr make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             const GroupOptions& options) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout());
  gloo_options->devices.push_back(
      options.hostname().empty()
          ? c10d::ProcessGroupGloo::createDefaultDevice()
          : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname()));
  // One worker thread: collectives of a group run in the order they are
  // issued, and the optimizers keep at most a few in flight (overlap comes
  // from computing while they travel, not from running them side by side).
  gloo_options->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
}

}  // namespace muon::distributed::detail
