// Built when no CBLAS is found: the generic blocked path serves every input.
#include "kernels/symmetric.h"

namespace muon::detail {

bool cblas_syrk(at::Tensor&, const at::Tensor&, bool, double, double) { return false; }
bool cblas_sum_of_squares(const at::Tensor&, double*) { return false; }
int blas_num_threads() { return 0; }
std::string blas_core_name() { return ""; }

}  // namespace muon::detail
