// Muon's fused passes (steps 1–6 of contiguous fp32 CPU parameters without
// the tensor-op path) and the matrix view every path shares.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "muon/optim/muon.h"
#include "util/scratch.h"

namespace muon::detail {

/// The matrices Muon sees in a parameter: `batch` matrices of rows × cols
/// (a stack of experts, a conv weight flattened to (out, in·kh·kw), a matrix).
struct MatrixView {
  int64_t batch;
  int64_t rows;
  int64_t cols;
};

/// The matrix view of `param` under `options` (stacked_experts).
MatrixView matrix_view(const at::Tensor& param, const MuonOptions& options);

/// Most elements a batch of matrices orthogonalized in one Newton–Schulz
/// call holds (8 MB of fp32 input): enough to make per-call costs
/// negligible, small enough that a batch's workspace stays near that of one
/// large matrix.
constexpr int64_t kMaxBatchElements = int64_t{1} << 21;

/// Megabatches: the indices of `count` items, grouped and cut. Item j joins
/// the group of the first earlier item i with same(i, j), else starts one;
/// each group, in order, is cut into runs of whole items holding at most
/// kMaxBatchElements elements and, when the group has that many matrices,
/// at most 1/`ways` of them (so that `ways` threads can share it). An item
/// holds matrices(i) matrices of matrix_elements(i) elements. The result
/// depends only on the items and `ways`.
std::vector<std::vector<size_t>> make_batches(size_t count,
                                              const std::function<bool(size_t, size_t)>& same,
                                              const std::function<int64_t(size_t)>& matrices,
                                              const std::function<int64_t(size_t)>& matrix_elements,
                                              int ways);

/// The factor decoupled, independent or palm weight decay multiplies the
/// parameter by (1 for l2 or no decay).
double decay_factor(const MuonOptions& options);

/// Steps 1–6 of one parameter as fused passes. Touches only the parameter,
/// its gradient and its state, so different parameters may run on
/// different threads.
struct FusedJob {
  at::Tensor* param;
  const MuonOptions* options;
  MuonParamState* state;
  MatrixView view;
};

/// Buffers reused by run_fused from step to step: one Scratch per thread
/// that runs batches.
struct FusedScratch {
  std::vector<Scratch> workers;
};

/// Runs every job. Jobs whose matrices have one shape and one set of
/// Newton–Schulz options are orthogonalized together, as one batched
/// Newton–Schulz call (batches of at most 2²¹ elements). Batches run in order
/// on this thread, or side by side on the persistent worker threads
/// (util/worker_pool.h), one batch per thread, when LibTorch has several
/// intra-op threads and that pays; each matrix gives the same bits either
/// way. The intermediates of a batch live in `scratch` (one Scratch per
/// thread), so they are not allocated afresh every step. The first error is
/// rethrown after every thread has stopped.
void run_fused(std::vector<FusedJob>& jobs, FusedScratch& scratch);

}  // namespace muon::detail
