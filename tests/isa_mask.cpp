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
#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <cstdlib>
#include <exception>


namespace {

const bool kLibTorchFollowsTheMask = [] {
  const bool masked = std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr ||
                      std::getenv("DNNL_MAX_CPU_ISA") != nullptr;
  if (!masked) return false;
  // Only where LibTorch's bf16 matmul really fails under the mask (at
  // AVX512_CORE oneDNN still has an emulated one, which LibTorch uses).
  const auto x = at::ones({64, 64}, at::kBFloat16);  // small products skip oneDNN
  try {
    (void)at::mm(x, x);
  } catch (const std::exception&) {  // oneDNN's dnnl::error, through ideep
    at::globalContext().setUserEnabledMkldnn(false);
    return true;
  }
  return false;
}();

}  // namespace
