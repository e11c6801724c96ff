// Muon's step as one function over a batch of parameters (muon_step: steps
// 1–6, each element-wise stage as tensor ops or as one-pass kernels), the
// megabatches and threads that run its fused batches, and the matrix view
// every path shares.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
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

/// One parameter of a Muon step. muon_step touches only the parameter, its
/// gradient and its state, so different items may run on different threads.
struct MuonStepItem {
  /// This process's tensor of the parameter (updated in place); it has a gradient.
  at::Tensor param;
  /// The options of its param group.
  const MuonOptions* options = nullptr;
  /// Its state, momentum buffer defined; muon_step counts the step.
  MuonParamState* state = nullptr;
  /// Its param group's index.
  size_t group = 0;
  /// Its matrices (read by the fused passes only).
  MatrixView view{1, 0, 0};
};

/// Whether muon_step's fused passes take `item`: a contiguous fp32 CPU
/// parameter, gradient and momentum buffer of one shape, no QKV split, no
/// l2 decay, fp32 or bf16 Newton–Schulz compute.
bool fusable(const MuonStepItem& item);

/// How muon_step runs a batch.
struct MuonStepPasses {
  /// The element-wise stages as one-pass kernels (kernels/fused_update.h):
  /// momentum with Σu² per matrix, the normalized Newton–Schulz input
  /// written once in the compute dtype (u is never stored), the weight decay
  /// folded into the update's pass; step 4 is the local Newton–Schulz on the
  /// whole batch as one call. Every item must be fusable, all of one matrix
  /// shape and one set of Newton–Schulz options. Otherwise: tensor ops,
  /// step 4 by `strategy`, then `stage`.
  bool fused = false;
  /// Step 4 when not fused (any layout; collective for distributed ones).
  Orthogonalizer* strategy = nullptr;
  /// Run on every item after step 4 when not fused; may be null.
  const UpdateStage* stage = nullptr;
  /// Where a fused batch's intermediates live (null: fresh tensors).
  Scratch* scratch = nullptr;
};

/// Muon's arithmetic (steps 1–6 of muon/optim/muon.h) for `batch`, whose
/// matrices are orthogonalized together: weight decay, momentum and
/// Nesterov per item, one orthogonalization of the batch, then the stage,
/// the scale and the update per item. Not fused, the strategy's
/// `orthogonalize` is called even for an empty batch (it is collective).
void muon_step(c10::ArrayRef<MuonStepItem> batch, const MuonStepPasses& passes);

/// Buffers reused by run_fused from step to step: one Scratch per thread
/// that runs batches.
struct FusedScratch {
  std::vector<Scratch> workers;
};

/// Runs muon_step's fused passes on every item (each fusable, whole
/// matrices of this process, no stage). Items whose matrices have one shape
/// and one set of Newton–Schulz options form one batch (at most 2²¹
/// elements). Batches run in order on this thread, or side by side on the
/// persistent worker threads (util/worker_pool.h), one batch per thread,
/// when LibTorch has several intra-op threads and that pays; each matrix
/// gives the same bits either way. The intermediates of a batch live in
/// `scratch` (one Scratch per thread), so they are not allocated afresh
/// every step. The first error is rethrown after every thread has stopped.
void run_fused(std::vector<MuonStepItem> items, FusedScratch& scratch);

}  // namespace muon::detail
