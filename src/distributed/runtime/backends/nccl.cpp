// NCCL backend, compiled only against a CUDA LibTorch (see CMakeLists.txt).
// Not built or tested on CPU-only machines.
#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "distributed/runtime/backend.h"

namespace muon::distributed::detail {

compat::BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             const GroupOptions& options) {
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout();
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
}

bool nccl_usable() { return at::globalContext().hasCUDA(); }

}  // namespace muon::distributed::detail

namespace muon::distributed {
bool nccl_available() { return true; }
}  // namespace muon::distributed
