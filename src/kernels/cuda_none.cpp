// A build without the CUDA kernels (see kernels/cuda.h): no case is taken.
#include <c10/util/Exception.h>

#include "kernels/cuda.h"

namespace muon::detail {

bool cuda_kernels_built() { return false; }

bool cuda_matmul(at::Tensor&, const at::Tensor&, const at::Tensor&, double, double) {
  return false;
}

bool cuda_syrk_upper(at::Tensor&, const at::Tensor&, bool, double, double) { return false; }

bool cuda_commuting_upper(at::Tensor&, const at::Tensor&, const at::Tensor&, double, double) {
  return false;
}

void* cuda_current_stream(const at::Device&) {
  TORCH_INTERNAL_ASSERT(false, "cuda_current_stream in a build without the CUDA kernels");
}

int64_t cuda_tiles(int64_t) { return 1; }

bool cuda_symmetrize(at::Tensor&, at::Tensor&, double) { return false; }

bool cuda_mirror(at::Tensor&) { return false; }

bool cuda_fused_eligible(const at::Tensor&) { return false; }

void cuda_fused_momentum(const std::vector<CudaFusedItem>&, at::Tensor&, double, double, bool) {
  TORCH_INTERNAL_ASSERT(false, "cuda_fused_momentum in a build without the CUDA kernels");
}

void cuda_fused_apply(const std::vector<CudaFusedItem>&) {
  TORCH_INTERNAL_ASSERT(false, "cuda_fused_apply in a build without the CUDA kernels");
}

}  // namespace muon::detail
