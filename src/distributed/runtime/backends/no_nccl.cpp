// Builds without CUDA: no NCCL backend.
#include <c10/util/Exception.h>

#include "distributed/runtime/backend.h"

namespace muon::distributed::detail {

compat::BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& /*store*/, int /*rank*/,
                             int /*size*/, const GroupOptions& /*options*/) {
  TORCH_CHECK_VALUE(false, "[muon::distributed::Group] backend nccl: this build of muon has no NCCL "
                    "(LibTorch without CUDA); use Backend::kGloo");
}

bool nccl_usable() { return false; }

}  // namespace muon::distributed::detail

namespace muon::distributed {
bool nccl_available() { return false; }
}  // namespace muon::distributed
