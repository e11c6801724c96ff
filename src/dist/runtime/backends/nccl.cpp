// NCCL backend, compiled only against a CUDA LibTorch (see CMakeLists.txt).
// Not built or tested on CPU-only machines.
#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "dist/runtime/backend.h"

namespace muon::dist::detail {

compat::BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             const GroupOptions& options) {
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout();
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
}

bool nccl_usable() { return at::globalContext().hasCUDA(); }

}  // namespace muon::dist::detail

namespace muon::dist {
bool nccl_available() { return true; }
}  // namespace muon::dist
