// Muon's step (muon_step: steps 1–6 of a batch, as tensor ops or fused
// passes) and the megabatches of its fused passes: parameters of one shape
// and options orthogonalized as one batch, batches side by side on the
// persistent worker threads.
#include "optim/muon_fused.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <optional>
#include <unordered_set>
#include <vector>

#include "kernels/cuda.h"
#include "kernels/fused_update.h"
#include "kernels/symmetric.h"
#include "muon/scaling.h"
#include "muon/spectral.h"
#include "newton_schulz_internal.h"
#include "optim/muon_internal.h"
#include "util/fault_injection.h"
#include "util/worker_pool.h"
#include "util/scale.h"

namespace muon::detail {
namespace {

std::atomic<int64_t> side_by_side{0};
std::atomic<int64_t> batches_run{0};

// Newton–Schulz work of `matrices` matrices of rows × cols, for scheduling:
// matrices·rows·cols·min(rows, cols).
double cost_of(int64_t matrices, int64_t rows, int64_t cols) {
  return static_cast<double>(matrices) * static_cast<double>(rows) * static_cast<double>(cols) *
         static_cast<double>(std::min(rows, cols));
}

// Items whose matrices share one shape and one set of Newton–Schulz options,
// orthogonalized as one batch (a "megabatch" across parameters): the fixed
// costs of a Newton–Schulz call (dispatch, allocation, one product call per
// step) are paid once for all of them instead of once per parameter.
struct Batch {
  std::vector<MuonStepItem> items;
  int64_t matrices = 0;
  double cost = 0;
};

// The fused items' megabatches (make_batches), with their sizes and costs;
// the items move into them.
std::vector<Batch> batches_of(std::vector<MuonStepItem>& items, int ways) {
  std::vector<BatchKey> keys;
  keys.reserve(items.size());
  for (const auto& item : items) {
    keys.push_back({item.view.rows, item.view.cols, item.param.scalar_type(),
                    item.param.device(), item.options});
  }
  const auto runs = make_batches(
      keys, [&](size_t i) { return items[i].view.batch; },
      [&](size_t i) { return items[i].view.rows * items[i].view.cols; }, ways);
  std::vector<Batch> batches;
  for (const auto& run : runs) {
    Batch b;
    for (const size_t i : run) {
      const auto& v = items[i].view;
      b.matrices += v.batch;
      b.cost += cost_of(v.batch, v.rows, v.cols);
      b.items.push_back(std::move(items[i]));
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

MomentumRule rule_of(const MuonOptions& o) {
  return {o.momentum(), o.momentum_style() == MomentumStyle::kEma, o.nesterov()};
}

// Weight decay spectral_clipped: p ← spectral_clipped_weight_decay(p, β, lr·wd)
// on each of the parameter's matrices (each block of a fused-QKV split and
// each head block, as step 4 sees them), in place.
void spectral_clipped_decay(at::Tensor& p, const MuonOptions& o) {
  const double beta = o.spectral_wd_beta();
  const double c = o.lr() * o.weight_decay();
  const auto v = matrix_view(p, o);
  const int64_t heads = head_blocks(o);
  const auto mats = p.reshape({v.batch, v.rows, v.cols});
  const auto& split = o.split_sizes();
  if (split.empty()) {
    p.copy_(spectral_clipped_weight_decay(mats.reshape({v.batch * heads, v.rows / heads, v.cols}),
                                          beta, c)
                .view(p.sizes()));
    return;
  }
  const int64_t groups = o.num_query_groups();
  const int64_t total = std::accumulate(split.begin(), split.end(), int64_t{0});
  const auto grouped = mats.view({v.batch, groups, total, v.cols});
  auto out = at::empty_like(grouped, at::MemoryFormat::Contiguous);
  int64_t offset = 0;
  for (const int64_t size : split) {
    const auto block =
        grouped.narrow(2, offset, size).reshape({v.batch * heads, groups * size / heads, v.cols});
    out.narrow(2, offset, size)
        .copy_(spectral_clipped_weight_decay(block, beta, c).view({v.batch, groups, size, v.cols}));
    offset += size;
  }
  p.copy_(out.view(p.sizes()));
}

// Steps 1–3 as tensor ops: weight decay (on the parameter, or on a copy of
// the gradient for l2), momentum into the buffer, Nesterov. Returns the
// tensor to orthogonalize: never the gradient; the buffer itself without
// Nesterov (newton_schulz reads its input and returns a tensor that never
// aliases it).
at::Tensor decay_and_momentum(const MuonStepItem& item) {
  at::Tensor p = item.param;  // a handle: the decay is in place
  const MuonOptions& o = *item.options;
  at::Tensor grad = p.grad();
  auto& buf = item.state->momentum_buffer();
  // 1. weight decay. l2 makes a new gradient tensor: p.grad() is never written.
  if (o.weight_decay() != 0) {
    if (o.weight_decay_mode() == WeightDecayMode::kL2) {
      grad = grad.add(p, o.weight_decay());
    } else if (o.weight_decay_mode() == WeightDecayMode::kSpectralClipped) {
      spectral_clipped_decay(p, o);
    } else if (o.weight_decay_mode() != WeightDecayMode::kCautious) {  // cautious: step 6
      scale_(p, decay_factor(o));
    }
  }
  // 2–3. momentum in place on the buffer and the Nesterov update (a new
  // tensor): one pass over contiguous fp32 CPU tensors, the arithmetic of
  // the fused passes.
  const double mu = o.momentum();
  const bool ema = o.momentum_style() == MomentumStyle::kEma;
  if (fused_eligible(buf) && fused_eligible(grad) && grad.sizes() == buf.sizes()) {
    at::Tensor nesterov_update;
    momentum_step(buf, grad, rule_of(o), &nesterov_update);
    return o.nesterov() ? nesterov_update : buf;
  }
  if (ema) {
    buf.lerp_(grad, 1 - mu);
  } else {
    scale_(buf, mu);
    buf.add_(grad);
  }
  if (!o.nesterov()) return buf;
  return ema ? grad.lerp(buf, mu) : grad.add(buf, mu);
}

// Steps 2–3 and step 4's normalization as fused passes: momentum into the
// buffer with Σu² of the Nesterov update u per matrix, then
// X₀ = u / (‖u‖_F·safety + eps) written once into `x0` in the compute
// dtype; u itself is never stored. The weight decay waits for the update's
// pass.
void fused_momentum(const MuonStepItem& item, at::Tensor x0) {
  const MuonOptions& o = *item.options;
  const at::Tensor& grad = item.param.grad();
  auto& buf = item.state->momentum_buffer();
  const int64_t n = item.view.batch;
  const MomentumRule rule = rule_of(o);
  std::vector<double> scale(static_cast<size_t>(n));
  momentum_pass(buf, grad, rule, n, scale.data());
  // Σu² past fp32's range (|u| ≳ 1e19): u again, exactly, summed in fp64.
  if (!std::all_of(scale.begin(), scale.end(), [](double s) { return std::isfinite(s); })) {
    auto u = at::empty({n, item.view.rows, item.view.cols}, item.param.options());
    const std::vector<double> ones(scale.size(), 1.0);
    normalized_update(u, buf, grad, rule, n, ones.data());
    for (const auto m : c10::irange(n)) scale[static_cast<size_t>(m)] = sum_of_squares(u[m]);
  }
  for (auto& s : scale) s = normalization_factor(s, o.ns());
  normalized_update(x0, buf, grad, rule, n, scale.data());
}

// Steps 2–4's element-wise part of a fused batch on the GPU: every item's
// momentum and normalized input in two kernels, no synchronization.
std::vector<CudaFusedItem> gpu_momentum(c10::ArrayRef<MuonStepItem> batch, at::Tensor& x0) {
  std::vector<CudaFusedItem> items;
  for (const auto& item : batch) {
    const MuonOptions& o = *item.options;
    CudaFusedItem g;
    g.grad = item.param.grad();
    g.buf = item.state->momentum_buffer();
    g.param = item.param;
    g.matrices = item.view.batch;
    g.mu = o.momentum();
    g.ema = o.momentum_style() == MomentumStyle::kEma;
    g.nesterov = o.nesterov();
    items.push_back(std::move(g));
  }
  const auto& ns = batch.front().options->ns();
  cuda_fused_momentum(items, x0, ns.coefficients().safety_factor, ns.eps(),
                      ns.eps_mode() == NsEpsMode::kClamp);
  return items;
}

// Steps 5–6 of a fused batch on the GPU: one kernel for every item.
void gpu_apply(std::vector<CudaFusedItem>& items, const std::vector<OrthogonalizeItem>& work) {
  for (size_t i = 0; i < items.size(); ++i) {
    items[i].orth = work[i].orth;
    items[i].decay = decay_factor(*work[i].options);
    items[i].step = -work[i].options->lr() * work[i].alpha;
  }
  cuda_fused_apply(items);
}

// Step 4 of a fused batch: one Newton–Schulz call on the normalized inputs
// of all its items; each item's part and scale.
void orthogonalize_fused(at::Tensor x0, c10::ArrayRef<MuonStepItem> batch,
                         std::vector<OrthogonalizeItem>& work) {
  const auto& first = batch.front();
  const auto orth = newton_schulz_normalized(std::move(x0), first.options->ns()).contiguous();
  int64_t offset = 0;
  for (const auto i : c10::irange(batch.size())) {
    const auto& v = batch[i].view;
    const MuonOptions& o = *batch[i].options;
    work[i].orth = orth.narrow(0, offset, v.batch);
    work[i].alpha = scale_factor(v.rows, v.cols, o.scale_mode(), o.extra_scale_factor());
    work[i].rows = v.rows;
    work[i].cols = v.cols;
    offset += v.batch;
  }
}

// Cautious weight decay (microsoft/dion, dion/muon.py
// muon_update_post_orthogonalize): p ← p − (p·m)·(lr·wd) with
// m = [p·u >= 0], u = alpha·orth the update about to be subtracted (its
// sign: alpha's times orth's), element-wise on this process's part, in the
// parameter's dtype.
void cautious_decay(at::Tensor& p, const at::Tensor& orth, double alpha, const MuonOptions& o) {
  const double coeff = o.lr() * o.weight_decay();
  if (coeff == 0) return;
  const auto product = at::mul(p, orth.reshape(p.sizes()));
  const auto mask = alpha >= 0 ? product.ge(0) : product.le(0);
  p.sub_(p.mul(mask).mul_(coeff));
}

// Steps 5–6: param ← param·decay − lr·alpha·orth, in the parameter's dtype;
// `decay` is the weight decay the fused passes left to this pass (else 1).
// Cautious decay comes first, masked by the update.
void apply_update(const OrthogonalizeItem& item, double decay) {
  at::Tensor p = item.param;  // a handle: the update is in place
  at::Tensor orth = item.orth;
  const double step = -item.options->lr() * item.alpha;
  if (item.options->weight_decay_mode() == WeightDecayMode::kCautious &&
      item.options->weight_decay() != 0 && p.numel() > 0) {
    cautious_decay(p, orth, item.alpha, *item.options);
  }
  if (fused_eligible(p) && orth.is_contiguous() && orth.device().is_cpu() &&
      orth.numel() == p.numel() &&
      (orth.scalar_type() == at::kFloat || orth.scalar_type() == at::kBFloat16)) {
    decay_and_add(p, orth, decay, step);
    return;
  }
  TORCH_INTERNAL_ASSERT(decay == 1.0);
  if (orth.scalar_type() != p.scalar_type()) orth = orth.to(p.scalar_type());
  p.add_(orth.view(p.sizes()), step);
}

// Below this much work in all (batch·rows·cols·min), running on several
// threads costs more than it saves: 2²² is ~0.1 GFLOP of Newton–Schulz.
constexpr double kMinParallelCost = 4194304.0;

// How many threads may run batches side by side (one batch per thread, each
// product on that thread alone); 1: one batch after another, each product
// on all of LibTorch's intra-op threads. Side by side wins when there are
// many matrices of moderate size: a 512-wide product gains little from a
// second thread, while two batches on two threads never wait on each other.
// It needs every product on oneDNN (a BLAS keeps its own thread pool) and
// enough work.
int side_by_side_threads(const std::vector<MuonStepItem>& items) {
  const int threads = at::get_num_threads();
  if (threads < 2 || items.size() < 2 || at::in_parallel_region()) return 1;
  double total = 0;
  std::unordered_set<const MuonParamState*> states;
  for (const auto& item : items) {
    if (!item.param.device().is_cpu()) return 1;  // GPU batches: one stream, in order
    if (!products_follow_thread_scope(item.options->ns().compute_dtype())) return 1;
    if (!states.insert(item.state).second) return 1;
    total += cost_of(item.view.batch, item.view.rows, item.view.cols);
  }
  return total < kMinParallelCost ? 1 : threads;
}

void run_batch(const Batch& batch, Scratch& scratch) {
  muon_step(batch.items, MuonStepPasses{/*fused=*/true, nullptr, nullptr, &scratch});
}

}  // namespace

bool fusable(const MuonStepItem& item) {
  const at::Tensor& p = item.param;
  const MuonOptions& o = *item.options;
  const auto compute = o.ns().compute_dtype();
  const at::Tensor& grad = p.grad();
  const at::Tensor& buf = item.state->momentum_buffer();
  const bool cpu = fused_eligible(p) && fused_eligible(grad) && fused_eligible(buf);
  const bool gpu = cuda_fused_eligible(p) && cuda_fused_eligible(grad) &&
                   cuda_fused_eligible(buf) && grad.device() == p.device() &&
                   buf.device() == p.device();
  return (cpu || gpu) && grad.sizes() == p.sizes() && buf.sizes() == p.sizes() &&
         p.numel() > 0 && o.split_sizes().empty() && head_blocks(o) == 1 &&
         (compute == at::kFloat || compute == at::kBFloat16) &&
         (o.weight_decay() == 0 || (o.weight_decay_mode() != WeightDecayMode::kL2 &&
                                    o.weight_decay_mode() != WeightDecayMode::kCautious)) &&
         !o.needs_spectral();
}

void muon_step(c10::ArrayRef<MuonStepItem> batch, const MuonStepPasses& passes) {
  const bool fused = passes.fused;
  TORCH_INTERNAL_ASSERT(fused ? passes.stage == nullptr : passes.strategy != nullptr);
  std::optional<ScratchScope> reuse;
  at::Tensor x0;  // fused: every item's normalized input, one batch for one call
  if (fused && !batch.empty()) {
    ++batches_run;
    reuse.emplace(passes.scratch);
    int64_t matrices = 0;
    for (const auto& item : batch) matrices += item.view.batch;
    const auto& first = batch.front();
    x0 = scratch_empty({matrices, first.view.rows, first.view.cols},
                       first.param.options().dtype(first.options->ns().compute_dtype()));
  }
  // 1–3. weight decay, momentum, Nesterov (fused: and step 4's normalization).
  std::vector<OrthogonalizeItem> work(batch.size());
  const bool gpu = fused && !batch.empty() && batch.front().param.is_cuda();
  int64_t offset = 0;
  for (const auto i : c10::irange(batch.size())) {
    const auto& item = batch[i];
    auto& st = *item.state;
    st.step(st.step() + 1);
    auto& w = work[i];
    w.param = item.param;
    w.options = item.options;
    w.group = item.group;
    w.state = item.state;
    if (gpu) {
      continue;  // the whole batch below
    } else if (fused) {
      fused_momentum(item, x0.narrow(0, offset, item.view.batch));
      offset += item.view.batch;
    } else {
      w.update = decay_and_momentum(item);
    }
  }
  std::vector<CudaFusedItem> gpu_items;
  if (gpu) gpu_items = gpu_momentum(batch, x0);
  // 4. orthogonalize: one Newton–Schulz call (fused) or the strategy, each
  // giving the scale of step 5.
  if (!batch.empty()) fault_point("Muon's orthogonalization");
  if (fused) {
    if (!batch.empty()) orthogonalize_fused(std::move(x0), batch, work);
  } else {
    passes.strategy->orthogonalize(work);  // collective: called even with no item
  }
  // The stage, then 5–6. scale and apply (fused: with step 1's weight decay,
  // in one pass).
  if (gpu) {
    gpu_apply(gpu_items, work);
  } else {
    for (auto& w : work) {
      if (passes.stage != nullptr) passes.stage->apply(w, *passes.strategy);
      apply_update(w, fused ? decay_factor(*w.options) : 1.0);
    }
  }
  // Changes to the weights after the update (collective: called even with no item).
  if (passes.stage != nullptr) passes.stage->after_update(work, *passes.strategy);
}

bool same_batch(const BatchKey& a, const BatchKey& b) {
  return !a.alone && !b.alone && a.rows == b.rows && a.cols == b.cols && a.dtype == b.dtype &&
         a.device == b.device && a.split == b.split &&
         (a.options == b.options ||
          (!a.by_group && !b.by_group && a.options->ns() == b.options->ns()));
}

std::vector<std::vector<size_t>> group_by_key(const std::vector<BatchKey>& keys) {
  std::vector<std::vector<size_t>> groups;
  for (size_t j = 0; j < keys.size(); ++j) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return same_batch(keys[g.front()], keys[j]); });
    if (it == groups.end()) {
      groups.push_back({j});
    } else {
      it->push_back(j);
    }
  }
  return groups;
}

std::vector<std::vector<size_t>> make_batches(const std::vector<BatchKey>& keys,
                                              const std::function<int64_t(size_t)>& matrices,
                                              const std::function<int64_t(size_t)>& matrix_elements,
                                              int ways) {
  const auto groups = group_by_key(keys);
  std::vector<std::vector<size_t>> runs;
  for (const auto& group : groups) {
    int64_t total = 0;
    for (const size_t i : group) total += matrices(i);
    const int64_t share = (total + ways - 1) / std::max(ways, 1);
    const int64_t fit = kMaxBatchElements / std::max<int64_t>(matrix_elements(group.front()), 1);
    const int64_t cap = std::max<int64_t>(1, std::min(fit, share));
    std::vector<size_t> current;
    int64_t held = 0;
    for (const size_t i : group) {
      if (!current.empty() && held + matrices(i) > cap) {
        runs.push_back(std::move(current));
        current.clear();
        held = 0;
      }
      current.push_back(i);
      held += matrices(i);
    }
    runs.push_back(std::move(current));
  }
  return runs;
}

MatrixView matrix_view(const at::Tensor& p, const MuonOptions& o) {
  if (o.stacked_experts() && p.dim() >= 3) {
    const auto [rows, cols] = matrix_dims(p.sizes().slice(1));
    return {p.size(0), rows, cols};
  }
  const auto [rows, cols] = matrix_dims(p.sizes());
  return {1, rows, cols};
}

void run_fused(std::vector<MuonStepItem> items, FusedScratch& scratch) {
  const int ways = side_by_side_threads(items);
  auto batches = batches_of(items, ways);
  // Side by side only when no batch holds more than its share of the work
  // (it would run alone at the end on one thread).
  double total = 0;
  double largest = 0;
  for (const auto& b : batches) {
    total += b.cost;
    largest = std::max(largest, b.cost);
  }
  const int threads = std::min<int>(ways, static_cast<int>(batches.size()));
  if (scratch.workers.empty()) scratch.workers.resize(1);
  if (threads <= 1 || largest > total / threads) {
    for (const auto& b : batches) run_batch(b, scratch.workers[0]);
    return;
  }
  if (scratch.workers.size() < static_cast<size_t>(threads)) scratch.workers.resize(threads);
  std::stable_sort(batches.begin(), batches.end(),
                   [](const Batch& a, const Batch& b) { return a.cost > b.cost; });
  std::atomic<size_t> next{0};
  const at::ThreadLocalState caller;  // grad mode and the rest, as on this thread
  auto work = [&](int worker) {
    at::ThreadLocalStateGuard same(caller);
    OneThreadScope one;
    try {
      auto& mine = scratch.workers[static_cast<size_t>(worker)];
      for (size_t i = next++; i < batches.size(); i = next++) run_batch(batches[i], mine);
    } catch (...) {
      next = batches.size();  // the others stop after their current batch
      throw;
    }
  };
  if (run_on_workers(threads, work)) {
    ++side_by_side;
  } else {
    // The pool serves another caller: this thread runs every batch.
    for (const auto& b : batches) run_batch(b, scratch.workers[0]);
  }
}

int64_t side_by_side_steps() { return side_by_side.load(); }

int64_t fused_batches_run() { return batches_run.load(); }

}  // namespace muon::detail
