// Muon's fused passes: parameters of one shape and options orthogonalized
// as one batch, batches side by side on the persistent worker threads.
#include "optim/muon_fused.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <unordered_set>
#include <vector>

#include "kernels/fused_update.h"
#include "kernels/symmetric.h"
#include "muon/scaling.h"
#include "newton_schulz_internal.h"
#include "optim/muon_internal.h"
#include "util/worker_pool.h"

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

// Jobs whose matrices share one shape and one set of Newton–Schulz options,
// orthogonalized as one batch (a "megabatch" across parameters): the fixed
// costs of a Newton–Schulz call (dispatch, allocation, one product call per
// step) are paid once for all of them instead of once per parameter.
struct Batch {
  std::vector<const FusedJob*> jobs;
  int64_t matrices = 0;
  double cost = 0;
};

bool same_batch_key(const FusedJob& a, const FusedJob& b) {
  return a.view.rows == b.view.rows && a.view.cols == b.view.cols &&
         (a.options == b.options || a.options->ns() == b.options->ns());
}

// The fused jobs' megabatches (make_batches), with their sizes and costs.
std::vector<Batch> batches_of(const std::vector<FusedJob>& jobs, int ways) {
  const auto runs = make_batches(
      jobs.size(), [&](size_t i, size_t j) { return same_batch_key(jobs[i], jobs[j]); },
      [&](size_t i) { return jobs[i].view.batch; },
      [&](size_t i) { return jobs[i].view.rows * jobs[i].view.cols; }, ways);
  std::vector<Batch> batches;
  for (const auto& run : runs) {
    Batch b;
    for (const size_t i : run) {
      const auto& v = jobs[i].view;
      b.jobs.push_back(&jobs[i]);
      b.matrices += v.batch;
      b.cost += cost_of(v.batch, v.rows, v.cols);
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

// Steps 1–6 of every job of a batch: each job's momentum pass, the
// normalized inputs of all of them in one tensor, one Newton–Schulz call,
// then each job's decay and update.
void run_batch(const Batch& batch, Scratch& scratch) {
  ++batches_run;
  ScratchScope reuse(&scratch);
  const auto& first = *batch.jobs.front();
  const auto& ns = first.options->ns();
  const int64_t rows = first.view.rows;
  const int64_t cols = first.view.cols;
  auto x0 = scratch_empty({batch.matrices, rows, cols},
                          first.param->options().dtype(ns.compute_dtype()));
  int64_t offset = 0;
  for (const auto* job : batch.jobs) {
    at::Tensor& p = *job->param;
    const MuonOptions& o = *job->options;
    const at::Tensor& grad = p.grad();
    auto& st = *job->state;
    st.step(st.step() + 1);
    auto& buf = st.momentum_buffer();

    // 2–3. momentum into the buffer and Σu² of the Nesterov update u, per matrix.
    const int64_t n = job->view.batch;
    const MomentumRule rule{o.momentum(), o.momentum_style() == MomentumStyle::kEma,
                            o.nesterov()};
    std::vector<double> scale(static_cast<size_t>(n));
    momentum_pass(buf, grad, rule, n, scale.data());
    // Σu² past fp32's range (|u| ≳ 1e19): u again, exactly, summed in fp64.
    if (!std::all_of(scale.begin(), scale.end(), [](double s) { return std::isfinite(s); })) {
      auto u = at::empty({n, rows, cols}, p.options());
      const std::vector<double> ones(scale.size(), 1.0);
      normalized_update(u, buf, grad, rule, n, ones.data());
      for (const auto m : c10::irange(n)) scale[static_cast<size_t>(m)] = sum_of_squares(u[m]);
    }
    // 4. X₀ = u / (‖u‖_F·safety + eps), written once in the compute dtype.
    for (auto& s : scale) s = normalization_factor(s, ns);
    auto slot = x0.narrow(0, offset, n);
    normalized_update(slot, buf, grad, rule, n, scale.data());
    offset += n;
  }
  const auto orth = newton_schulz_normalized(std::move(x0), ns).contiguous();
  // 1, 5–6. weight decay, scale and update in one pass per parameter.
  offset = 0;
  for (const auto* job : batch.jobs) {
    const MuonOptions& o = *job->options;
    const int64_t n = job->view.batch;
    const double alpha = scale_factor(rows, cols, o.scale_mode(), o.extra_scale_factor());
    decay_and_add(*job->param, orth.narrow(0, offset, n), decay_factor(o), -o.lr() * alpha);
    offset += n;
  }
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
int side_by_side_threads(const std::vector<FusedJob>& jobs) {
  const int threads = at::get_num_threads();
  if (threads < 2 || jobs.size() < 2 || at::in_parallel_region()) return 1;
  double total = 0;
  std::unordered_set<const MuonParamState*> states;
  for (const auto& job : jobs) {
    if (!products_follow_thread_scope(job.options->ns().compute_dtype())) return 1;
    if (!states.insert(job.state).second) return 1;
    total += cost_of(job.view.batch, job.view.rows, job.view.cols);
  }
  return total < kMinParallelCost ? 1 : threads;
}


}  // namespace

std::vector<std::vector<size_t>> make_batches(size_t count,
                                              const std::function<bool(size_t, size_t)>& same,
                                              const std::function<int64_t(size_t)>& matrices,
                                              const std::function<int64_t(size_t)>& matrix_elements,
                                              int ways) {
  std::vector<std::vector<size_t>> groups;
  for (size_t j = 0; j < count; ++j) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return same(g.front(), j); });
    if (it == groups.end()) {
      groups.push_back({j});
    } else {
      it->push_back(j);
    }
  }
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

void run_fused(std::vector<FusedJob>& jobs, FusedScratch& scratch) {
  const int ways = side_by_side_threads(jobs);
  auto batches = batches_of(jobs, ways);
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
