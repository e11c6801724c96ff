// Muon's step as one function over a batch of parameters (muon_step: steps
// 1–6, each element-wise stage as tensor ops or as one-pass kernels), the
// megabatches and threads that run its fused batches, and the matrix view
// every path shares.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/ArrayRef.h>

#include <array>
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

/// The head blocks each matrix (or split block) of a group is orthogonalized
/// in: options.num_heads() when above 1, else 1.
inline int64_t head_blocks(const MuonOptions& options) {
  return options.num_heads() > 1 ? options.num_heads() : 1;
}

/// Most elements a batch of matrices orthogonalized in one Newton–Schulz
/// call holds (8 MB of fp32 input): enough to make per-call costs
/// negligible, small enough that a batch's workspace stays near that of one
/// large matrix.
constexpr int64_t kMaxBatchElements = int64_t{1} << 21;

/// What matrices must share to be orthogonalized as one batch, the one key
/// every path groups by (Muon's fused passes, the local strategy, the
/// owner-compute row-shard strategy): their shape, dtype and device, their
/// Newton–Schulz options, and what a layout adds.
struct BatchKey {
  int64_t rows = 0;
  int64_t cols = 0;
  at::ScalarType dtype = at::kFloat;
  /// Left at its default by layouts whose processes must form the same
  /// batches (devices may differ between processes).
  at::Device device = at::kCPU;
  /// The options of the matrix's param group: keys match when they are the
  /// same options, or (unless `by_group`) have equal Newton–Schulz options.
  const MuonOptions* options = nullptr;
  /// Keep param groups apart: only the same options match.
  bool by_group = false;
  /// How a layout splits the matrix, which must match too (zeros for a
  /// whole matrix; a tensor-parallel mode and partition dim).
  std::array<int64_t, 2> split{};
  /// Never batched (a fused-QKV matrix: one call per block).
  bool alone = false;
};

/// Whether matrices under `a` and `b` go in one batch.
bool same_batch(const BatchKey& a, const BatchKey& b);

/// The indices of `keys` grouped by same_batch with each group's first
/// member: groups in order of first appearance, members in order.
std::vector<std::vector<size_t>> group_by_key(const std::vector<BatchKey>& keys);

/// Megabatches: group_by_key's groups, each, in order, cut into runs of whole
/// items holding at most kMaxBatchElements elements and, when the group has
/// that many matrices, at most 1/`ways` of them (so that `ways` threads can
/// share it). An item holds matrices(i) matrices of matrix_elements(i)
/// elements. The result depends only on the items and `ways`.
std::vector<std::vector<size_t>> make_batches(const std::vector<BatchKey>& keys,
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
/// parameter, gradient and momentum buffer of one shape, no QKV split or
/// per-head blocks, no
/// l2 or cautious decay (cautious needs the update's sign: the plain path), fp32 or bf16
/// Newton–Schulz compute, no spectral option (MuonOptions::needs_spectral: those run on the plain
/// path).
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
