// Muon's fused passes, over matrices side by side on several threads.
#include "optim/muon_fused.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <vector>

#include "kernels/fused_update.h"
#include "kernels/symmetric.h"
#include "muon/scaling.h"
#include "newton_schulz_internal.h"
#include "optim/muon_internal.h"

namespace muon::detail {
namespace {

// A job's Newton–Schulz work, for scheduling: batch·rows·cols·min(rows, cols).
double cost_of(const FusedJob& job) {
  const auto& v = job.view;
  return static_cast<double>(v.batch) * static_cast<double>(v.rows) *
         static_cast<double>(v.cols) * static_cast<double>(std::min(v.rows, v.cols));
}

void run_fused_job(const FusedJob& job) {
  at::Tensor& p = *job.param;
  const MuonOptions& o = *job.options;
  const at::Tensor& grad = p.grad();
  auto& st = *job.state;
  st.step(st.step() + 1);
  auto& buf = st.momentum_buffer();

  // 2–3. momentum into the buffer and Σu² of the Nesterov update u, per matrix.
  const auto& v = job.view;
  const MomentumRule rule{o.momentum(), o.momentum_style() == MomentumStyle::kEma,
                                  o.nesterov()};
  std::vector<double> scale(static_cast<size_t>(v.batch));
  momentum_pass(buf, grad, rule, v.batch, scale.data());
  // Σu² past fp32's range (|u| ≳ 1e19): u again, exactly, summed in fp64.
  if (!std::all_of(scale.begin(), scale.end(), [](double s) { return std::isfinite(s); })) {
    auto u = at::empty({v.batch, v.rows, v.cols}, p.options());
    const std::vector<double> ones(scale.size(), 1.0);
    normalized_update(u, buf, grad, rule, v.batch, ones.data());
    for (const auto m : c10::irange(v.batch)) scale[static_cast<size_t>(m)] = sum_of_squares(u[m]);
  }
  // 4. X₀ = u / (‖u‖_F·safety + eps), written once in the compute dtype;
  // then the iterations.
  for (auto& s : scale) s = normalization_factor(s, o.ns());
  auto x0 = at::empty({v.batch, v.rows, v.cols}, p.options().dtype(o.ns().compute_dtype()));
  normalized_update(x0, buf, grad, rule, v.batch, scale.data());
  const auto orth = newton_schulz_normalized(std::move(x0), o.ns()).contiguous();
  // 1, 5–6. weight decay, scale and update in one pass.
  const double decay = decay_factor(o);
  const double alpha = scale_factor(v.rows, v.cols, o.scale_mode(), o.extra_scale_factor());
  decay_and_add(p, orth, decay, -o.lr() * alpha);
}

// Below this much work in all (batch·rows·cols·min), starting threads costs
// more than it saves: 2²² is ~0.1 GFLOP of Newton–Schulz.
constexpr double kMinParallelCost = 4194304.0;

// How many threads run `jobs` side by side, one matrix per thread and each
// product on that thread alone; 1: one after another, each product on all of
// LibTorch's intra-op threads. Side by side wins when there are many
// matrices of moderate size: a 512-wide product gains little from a second
// thread, while two matrices on two threads never wait on each other. It
// needs every product on oneDNN (a BLAS keeps its own thread pool) and no
// matrix with more than its share of the work (it would run alone at the
// end on one thread).
int fused_threads(const std::vector<FusedJob>& jobs) {
  const int threads = at::get_num_threads();
  if (threads < 2 || jobs.size() < 2 || at::in_parallel_region()) return 1;
  double total = 0;
  double largest = 0;
  std::unordered_set<const MuonParamState*> states;
  for (const auto& job : jobs) {
    if (!products_follow_thread_scope(job.options->ns().compute_dtype())) return 1;
    if (!states.insert(job.state).second) return 1;
    const double cost = cost_of(job);
    total += cost;
    largest = std::max(largest, cost);
  }
  const int n = std::min<int>(threads, static_cast<int>(jobs.size()));
  if (total < kMinParallelCost || largest > total / n) return 1;
  return n;
}

std::atomic<int64_t> side_by_side{0};

}  // namespace

MatrixView matrix_view(const at::Tensor& p, const MuonOptions& o) {
  if (o.stacked_experts() && p.dim() >= 3) {
    const auto [rows, cols] = matrix_dims(p.sizes().slice(1));
    return {p.size(0), rows, cols};
  }
  const auto [rows, cols] = matrix_dims(p.sizes());
  return {1, rows, cols};
}

void run_fused(std::vector<FusedJob>& jobs) {
  const int threads = fused_threads(jobs);
  if (threads <= 1) {
    for (const auto& job : jobs) run_fused_job(job);
    return;
  }
  ++side_by_side;
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const FusedJob& a, const FusedJob& b) { return cost_of(a) > cost_of(b); });
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  const at::ThreadLocalState caller;  // grad mode and the rest, as on this thread
  auto work = [&](size_t w) {
    try {
      at::ThreadLocalStateGuard same(caller);
      OneThreadScope one;
      for (size_t i = next++; i < jobs.size(); i = next++) run_fused_job(jobs[i]);
    } catch (...) {
      errors[w] = std::current_exception();
      next = jobs.size();  // the others stop after their current job
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (size_t w = 1; w < static_cast<size_t>(threads); ++w) {
    try {
      pool.emplace_back(work, w);
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the ones started share the jobs
    }
  }
  work(0);
  for (auto& t : pool) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

int64_t side_by_side_steps() { return side_by_side.load(); }

}  // namespace muon::detail
