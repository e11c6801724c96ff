// Muon's element-wise passes on the GPU (kernels/cuda.h): one table of the
// batch's matrices uploaded once per pass, then one kernel per pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda.h"
#include "kernels/cuda/kernels.h"

namespace muon::detail {
namespace {

void check_launch(int error, const char* what) {
  TORCH_CHECK(error == 0, "[muon] ", what, " failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(error)));
}

int64_t matrix_numel(const std::vector<CudaFusedItem>& items) {
  const auto& first = items.front();
  return first.param.numel() / std::max<int64_t>(1, first.matrices);
}

// The slots of every matrix of the batch on the items' device (an
// asynchronous copy from pinned memory: no synchronization).
at::Tensor upload_slots(const std::vector<CudaFusedItem>& items, bool with_orth) {
  const int64_t numel = matrix_numel(items);
  std::vector<cuda::MatrixSlot> slots;
  for (const auto& item : items) {
    TORCH_INTERNAL_ASSERT(item.param.numel() == item.matrices * numel &&
                          item.grad.numel() == item.param.numel() &&
                          item.buf.numel() == item.param.numel());
    const auto orth_size = with_orth ? static_cast<int64_t>(item.orth.element_size()) : 0;
    for (int64_t m = 0; m < item.matrices; ++m) {
      cuda::MatrixSlot s{};
      s.grad = item.grad.data_ptr<float>() + m * numel;
      s.buf = item.buf.data_ptr<float>() + m * numel;
      s.param = item.param.data_ptr<float>() + m * numel;
      s.orth = with_orth ? static_cast<const char*>(item.orth.data_ptr()) + m * numel * orth_size
                         : nullptr;
      s.mu = static_cast<float>(item.mu);
      s.ema = item.ema;
      s.nesterov = item.nesterov;
      s.decay = static_cast<float>(item.decay);
      s.step = static_cast<float>(item.step);
      slots.push_back(s);
    }
  }
  const auto bytes = static_cast<int64_t>(slots.size() * sizeof(cuda::MatrixSlot));
  auto host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::copy_n(reinterpret_cast<const uint8_t*>(slots.data()), bytes, host.data_ptr<uint8_t>());
  return host.to(items.front().param.device(), /*non_blocking=*/true);
}

int64_t total_matrices(const std::vector<CudaFusedItem>& items) {
  int64_t n = 0;
  for (const auto& item : items) n += item.matrices;
  return n;
}

void* stream_of(const at::Tensor& t) { return cuda_current_stream(t.device()); }

cuda::Dtype dtype_of(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
  return t.scalar_type() == at::kBFloat16 ? cuda::Dtype::kBFloat16 : cuda::Dtype::kFloat32;
}

}  // namespace

bool cuda_fused_eligible(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

void cuda_fused_momentum(const std::vector<CudaFusedItem>& items, at::Tensor& x0, double safety,
                         double eps, bool clamp) {
  if (items.empty()) return;
  const int64_t numel = matrix_numel(items);
  const int64_t matrices = total_matrices(items);
  TORCH_INTERNAL_ASSERT(x0.is_contiguous() && x0.numel() == matrices * numel &&
                        x0.device() == items.front().param.device());
  const auto slots = upload_slots(items, /*with_orth=*/false);
  const auto* table = reinterpret_cast<const cuda::MatrixSlot*>(slots.data_ptr<uint8_t>());
  auto partials = at::empty({matrices * cuda::chunks_per_matrix(numel)},
                            x0.options().dtype(at::kDouble));
  const auto stream = stream_of(x0);
  check_launch(cuda::momentum(table, matrices, numel, partials.data_ptr<double>(), stream),
               "Muon's momentum pass");
  check_launch(cuda::normalize(table, matrices, numel, partials.data_ptr<double>(), safety, eps,
                               clamp, x0.data_ptr(), dtype_of(x0), stream),
               "Muon's normalization pass");
}

void cuda_fused_apply(const std::vector<CudaFusedItem>& items) {
  if (items.empty()) return;
  const auto& orth = items.front().orth;
  for (const auto& item : items) {
    TORCH_INTERNAL_ASSERT(item.orth.is_contiguous() && item.orth.numel() == item.param.numel() &&
                          item.orth.scalar_type() == orth.scalar_type() &&
                          item.orth.device() == item.param.device());
  }
  const auto slots = upload_slots(items, /*with_orth=*/true);
  const auto* table = reinterpret_cast<const cuda::MatrixSlot*>(slots.data_ptr<uint8_t>());
  check_launch(cuda::decay_and_add(table, total_matrices(items), matrix_numel(items),
                                   dtype_of(orth), stream_of(orth)),
               "Muon's update pass");
}

}  // namespace muon::detail
