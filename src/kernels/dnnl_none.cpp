// Built when oneDNN's headers or library are not found: every product goes
// through ATen (and CBLAS where available).
#include "kernels/symmetric.h"

namespace muon::detail {

bool dnnl_matmul_available() { return false; }
bool dnnl_has_avx512() { return false; }
bool dnnl_bf16_available() { return false; }
std::string dnnl_isa_name() { return ""; }
int exchange_omp_threads(int n) { return n; }

bool dnnl_matmul(at::Tensor&, const at::Tensor&, const at::Tensor&, double, double, int, bool) {
  return false;
}

}  // namespace muon::detail
