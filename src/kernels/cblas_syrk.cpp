// SYRK through CBLAS for contiguous CPU float/double matrices.
#include <cblas.h>

#include <string>

#include "kernels/symmetric.h"

namespace muon::detail {

int blas_num_threads() {
#ifdef OPENBLAS_VERSION
  return openblas_get_num_threads();
#else
  return 0;
#endif
}

std::string blas_core_name() {
#ifdef OPENBLAS_VERSION
  const char* name = openblas_get_corename();
  return name ? name : "";
#else
  return "";
#endif
}

bool cblas_sum_of_squares(const at::Tensor& x, double* out) {
  if (!x.device().is_cpu() || !x.is_contiguous() || x.scalar_type() != at::kDouble) return false;
  const int n = static_cast<int>(x.numel());
  if (static_cast<int64_t>(n) != x.numel()) return false;
  const double* p = x.data_ptr<double>();
  *out = cblas_ddot(n, p, 1, p, 1);
  return true;
}

bool cblas_syrk(at::Tensor& out, const at::Tensor& x, bool trans, double alpha, double beta) {
  const auto dtype = x.scalar_type();
  if (!x.device().is_cpu() || (dtype != at::kFloat && dtype != at::kDouble) ||
      !x.is_contiguous() || !out.is_contiguous() || out.scalar_type() != dtype) {
    return false;
  }
  const int64_t batch = x.size(0);
  const int64_t s = out.size(1);
  const int64_t l = trans ? x.size(1) : x.size(2);
  const auto op = trans ? CblasTrans : CblasNoTrans;
  const int64_t lda = x.size(2);  // row-major leading dimension of X as stored
  for (int64_t i = 0; i < batch; ++i) {
    if (dtype == at::kFloat) {
      cblas_ssyrk(CblasRowMajor, CblasUpper, op, static_cast<int>(s), static_cast<int>(l),
                  static_cast<float>(alpha), x[i].data_ptr<float>(), static_cast<int>(lda),
                  static_cast<float>(beta), out[i].data_ptr<float>(), static_cast<int>(s));
    } else {
      cblas_dsyrk(CblasRowMajor, CblasUpper, op, static_cast<int>(s), static_cast<int>(l), alpha,
                  x[i].data_ptr<double>(), static_cast<int>(lda), beta,
                  out[i].data_ptr<double>(), static_cast<int>(s));
    }
  }
  mirror_upper_to_lower(out);
  return true;
}

}  // namespace muon::detail
