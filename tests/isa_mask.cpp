// Linked into every test program: LibTorch's own bf16 products under an
// instruction-set mask.
//
// scripts/test.sh runs the numerical suites again with ONEDNN_MAX_CPU_ISA
// below the CPU's own level (docs/benchmarks.md, "Instruction sets"). At
// AVX2, oneDNN has no bf16 matmul, but LibTorch 1.13 decides from CPUID
// alone whether to send its bf16 matmul to oneDNN, so on an AVX-512 CPU
// under the mask every at::mm in bf16 throws ("could not create a primitive
// descriptor"). On a CPU that really lacks AVX-512, LibTorch's check fails
// and its bf16 matmul runs its own GEMM. The tests' plain references use
// LibTorch's bf16 matmul, so under such a mask they are given what they get
// on such a CPU: LibTorch's oneDNN use turned off. The library's own bf16
// products never use LibTorch's (src/kernels/symmetric.cpp).
#include <ATen/Context.h>

#include <cstdlib>

#include "kernels/symmetric.h"

namespace {

const bool kLibTorchFollowsTheMask = [] {
  const bool masked = std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr ||
                      std::getenv("DNNL_MAX_CPU_ISA") != nullptr;
  if (masked && muon::detail::dnnl_matmul_available() && !muon::detail::dnnl_bf16_available()) {
    at::globalContext().setUserEnabledMkldnn(false);
    return true;
  }
  return false;
}();

}  // namespace
