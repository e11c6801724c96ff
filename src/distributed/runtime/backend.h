#pragma once
// Backend construction, one file per backend (backends/gloo.cpp,
// backends/nccl.cpp or backends/no_nccl.cpp, chosen in CMake). Internal.
#include <c10/util/intrusive_ptr.h>

#include "distributed/runtime/compat.h"
#include "muon/distributed/runtime/group.h"

namespace muon::distributed::detail {

/// A Gloo process group of `size` ranks over `store`.
compat::BackendPtr make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             const GroupOptions& options);

/// An NCCL process group; raises c10::Error in builds without NCCL.
compat::BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             const GroupOptions& options);

/// Whether NCCL can run here (built with it and a CUDA device present).
bool nccl_usable();

}  // namespace muon::distributed::detail
