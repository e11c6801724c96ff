// Builds without CUDA: no NCCL backend.
#include <c10/util/Exception.h>

#include "dist/runtime/backend.h"

namespace muon::dist::detail {

compat::BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& /*store*/, int /*rank*/,
                             int /*size*/, const GroupOptions& /*options*/) {
  TORCH_CHECK_VALUE(false, "[muon::dist::Group] backend nccl: this build of muon has no NCCL "
                    "(LibTorch without CUDA); use Backend::kGloo");
}

bool nccl_usable() { return false; }

}  // namespace muon::dist::detail

namespace muon::dist {
bool nccl_available() { return false; }
}  // namespace muon::dist
