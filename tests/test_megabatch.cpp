// Muon's megabatch (parameters of one shape and one set of Newton–Schulz
// options orthogonalized in one batched call) and the persistent worker
// pool that runs batches side by side.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/symmetric.h"
#include "muon/newton_schulz.h"
#include "muon/optim/muon.h"
#include "optim/muon_fused.h"
#include "optim/muon_internal.h"
#include "util/worker_pool.h"

namespace muon::test {
namespace {

using torch::optim::OptimizerParamGroup;

struct Spec {
  std::vector<int64_t> shape;
  MuonOptions options;
  // Parameters the fused passes do not take (bf16, or a transposed view)
  // go through the strategy's tensor path, which batches too.
  at::ScalarType dtype = at::kFloat;
  bool transposed = false;
};

std::vector<at::Tensor> make_params(const std::vector<Spec>& specs, uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (const auto& s : specs) {
    auto p = at::randn(s.shape).to(s.dtype);
    if (s.transposed) p = p.t();
    out.push_back(p.requires_grad_(true));
  }
  return out;
}

void set_grads(std::vector<at::Tensor>& params, uint64_t seed) {
  at::manual_seed(seed);
  for (auto& p : params) p.mutable_grad() = at::randn(p.sizes()).to(p.scalar_type());
}

// Every parameter in one optimizer (one group per parameter, so batches
// cross groups) against every parameter alone in its own optimizer: the
// same bits. Batching is invisible in the result.
void expect_batching_invisible(const std::vector<Spec>& specs) {
  auto together = make_params(specs, 3);
  auto alone = make_params(specs, 3);
  std::vector<OptimizerParamGroup> groups;
  for (size_t i = 0; i < specs.size(); ++i) {
    groups.emplace_back(std::vector<at::Tensor>{together[i]},
                        std::make_unique<MuonOptions>(specs[i].options));
  }
  Muon batched(std::move(groups));
  std::vector<std::unique_ptr<Muon>> single;
  for (size_t i = 0; i < specs.size(); ++i) {
    single.push_back(std::make_unique<Muon>(std::vector<at::Tensor>{alone[i]}, specs[i].options));
  }
  for (uint64_t step = 0; step < 3; ++step) {
    set_grads(together, 100 + step);
    set_grads(alone, 100 + step);
    reset_newton_schulz_flops_on_this_thread();
    batched.step();
    const double batched_flops = newton_schulz_flops_on_this_thread();
    reset_newton_schulz_flops_on_this_thread();
    for (auto& opt : single) opt->step();
    // Every matrix orthogonalized once, batched or not (the counter is the
    // calling thread's: with several threads, batches run on workers).
    if (at::get_num_threads() == 1) {
      EXPECT_DOUBLE_EQ(batched_flops, newton_schulz_flops_on_this_thread());
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(at::equal(together[i], alone[i])) << "parameter " << i;
  }
}

TEST(Megabatch, SameShapeParametersGiveTheirOwnBits) {
  const int before = at::get_num_threads();
  for (const int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (const auto compute : {at::kFloat, at::kBFloat16}) {
      std::vector<Spec> specs;
      for (int i = 0; i < 12; ++i) {
        // lr, decay and momentum differ per group; the shape and the
        // Newton–Schulz options are shared, so all 12 form one batch.
        auto o = MuonOptions(0.01 * (1 + i % 3)).weight_decay(0.1 * (i % 2)).momentum(0.9 + 0.01 * (i % 4));
        o.ns().compute_dtype(compute);
        specs.push_back({{64, 96}, o});
      }
      expect_batching_invisible(specs);
    }
  }
  at::set_num_threads(before);
}

TEST(Megabatch, DifferentShapesAndOptionsAreNotMixed) {
  // Same element count, different shapes; same shape, different schedules,
  // coefficient sets, compute dtypes or eps: each must keep its own
  // Newton–Schulz, which mixing would change.
  auto base = MuonOptions(0.02);
  std::vector<Spec> specs{
      {{48, 64}, base},
      {{64, 48}, base},
      {{48, 64}, MuonOptions(base).ns_steps(3)},
      {{48, 64}, MuonOptions(base).ns_coefficients("simple")},
      {{48, 64}, MuonOptions(base).ns_compute_dtype(at::kBFloat16)},
      {{48, 64}, MuonOptions(base).ns_eps(1e-2)},
      {{4, 48, 64}, MuonOptions(base).stacked_experts(true)},  // 4 matrices, batched with 48×64
      {{48, 64}, base},
  };
  expect_batching_invisible(specs);
}

TEST(Megabatch, TensorPathParametersGiveTheirOwnBits) {
  // bf16 parameters and transposed fp32 views: not fused, orthogonalized by
  // the local strategy in batches of one shape, dtype and options.
  std::vector<Spec> specs;
  for (int i = 0; i < 6; ++i) {
    auto o = MuonOptions(0.01 * (1 + i % 3)).weight_decay(0.05 * (i % 2));
    specs.push_back({{40, 72}, o, at::kBFloat16});
    specs.push_back({{40, 72}, o, at::kFloat, /*transposed=*/true});  // a 72×40 view
    specs.push_back({{40, 72}, MuonOptions(o).ns_steps(4), at::kBFloat16});
  }
  specs.push_back({{48, 24}, MuonOptions(0.02).split_sizes({8, 8, 8}).num_query_groups(2)});
  expect_batching_invisible(specs);
}

TEST(Megabatch, ManySmallMatricesTakeOneNewtonSchulzCall) {
  // 64 parameters of 32×32 (65,536 elements, under a batch's 2²¹): one
  // batch, so one Newton–Schulz call for the whole step on one thread.
  std::vector<at::Tensor> params;
  at::manual_seed(5);
  for (int i = 0; i < 64; ++i) params.push_back(at::randn({32, 32}).requires_grad_(true));
  Muon opt(params, MuonOptions(0.02));
  set_grads(params, 6);
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const auto batches = detail::fused_batches_run();
  opt.step();
  EXPECT_EQ(detail::fused_batches_run(), batches + 1);
  // 2²¹ elements at most per batch: 40 matrices of 256×256 (65,536 each)
  // make two batches of 32 and 8.
  std::vector<at::Tensor> large;
  for (int i = 0; i < 40; ++i) large.push_back(at::randn({256, 256}).requires_grad_(true));
  Muon opt_large(large, MuonOptions(0.02));
  set_grads(large, 7);
  const auto before_large = detail::fused_batches_run();
  opt_large.step();
  EXPECT_EQ(detail::fused_batches_run(), before_large + 2);
  at::set_num_threads(before);
}

// One oneDNN primitive for a whole batch (3-D) gives every matrix the bits
// of its own 2-D product, for whole matrices and for panels (strided
// blocks) of them, with and without accumulation: batching is invisible.
TEST(Megabatch, BatchedProductsGiveEachMatrixItsOwnBits) {
  // Through the library's batched product, whichever kernel it picks on
  // this CPU (one oneDNN primitive for the batch, or one product per
  // matrix: the BLAS, bf16 widened to fp32), against a batch of one.
  at::manual_seed(9);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const auto a = at::randn({5, 48, 300}).to(dtype);
    const auto b = at::randn({5, 300, 40}).to(dtype);
    auto c = at::randn({5, 64, 64});  // fp32 results, a 40-wide panel of each
    auto batched = c.narrow(1, 8, 48).narrow(2, 20, 40);
    auto single = c.clone();
    detail::batched_addmm_out(batched, batched, a, b, 1.5, 0.5);
    for (int64_t i = 0; i < 5; ++i) {
      auto out = single.narrow(0, i, 1).narrow(1, 8, 48).narrow(2, 20, 40);
      detail::batched_addmm_out(out, out, a.narrow(0, i, 1), b.narrow(0, i, 1), 1.5, 0.5);
    }
    EXPECT_TRUE(at::equal(c, single)) << dtype << "; " << detail::describe_cpu_products(dtype);
    if (!detail::dnnl_matmul_available()) continue;
    // Shapes that do not match are refused, touching nothing.
    auto copy = c.clone();
    EXPECT_FALSE(detail::dnnl_matmul(batched, a.narrow(0, 0, 4), b, 1.0, 0.0, 1));
    EXPECT_FALSE(detail::dnnl_matmul(batched, a.select(0, 0), b, 1.0, 0.0, 1));
    EXPECT_TRUE(at::equal(c, copy));
  }
}

TEST(WorkerPool, RunsEveryIndexOnceAndReusesItsThreads) {
  std::vector<std::atomic<int>> hits(4);
  ASSERT_TRUE(detail::run_on_workers(4, [&](int w) { ++hits[static_cast<size_t>(w)]; }));
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  const int started = detail::worker_threads_started();
  EXPECT_GE(started, 3);
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(detail::run_on_workers(4, [&](int w) { ++hits[static_cast<size_t>(w)]; }));
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 21);
  EXPECT_EQ(detail::worker_threads_started(), started);  // no thread started per call
}

TEST(WorkerPool, RethrowsTheFirstErrorAfterEveryWorkerStopped) {
  std::atomic<int> finished{0};
  EXPECT_THROW(detail::run_on_workers(3,
                                      [&](int w) {
                                        if (w == 2) throw std::runtime_error("worker 2 failed");
                                        ++finished;
                                      }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 2);
  // Still usable afterwards.
  EXPECT_TRUE(detail::run_on_workers(3, [&](int) { ++finished; }));
  EXPECT_EQ(finished.load(), 5);
}

TEST(WorkerPool, BusyOrNestedCallsRunNothingAndReturnFalse) {
  // From inside a worker, and from a second thread while the pool is held:
  // false, so the caller does its work itself instead of waiting.
  std::atomic<bool> nested{true};
  std::atomic<bool> other{true};
  std::atomic<bool> release{false};
  std::atomic<bool> holding{false};
  std::thread second([&] {
    while (!holding) std::this_thread::yield();
    other = detail::run_on_workers(2, [](int) {});
    release = true;
  });
  ASSERT_TRUE(detail::run_on_workers(2, [&](int w) {
    if (w == 1) nested = detail::run_on_workers(2, [](int) {});
    if (w == 0) {
      holding = true;
      while (!release) std::this_thread::yield();
    }
  }));
  second.join();
  EXPECT_FALSE(nested.load());
  EXPECT_FALSE(other.load());
  EXPECT_FALSE(detail::run_on_workers(1, [](int) {}));  // one worker: nothing to share
}

// The one key every path batches by: shape, dtype and Newton–Schulz options
// (across param groups unless a layout keeps them apart), a layout's split,
// fused-QKV matrices alone; groups in order of first appearance.
TEST(Megabatch, BatchKeyGroupsInOrderOfFirstAppearance) {
  const MuonOptions a(0.02);
  const MuonOptions b(0.01);  // another group, the same Newton–Schulz options
  MuonOptions c(0.02);
  c.ns().steps(3);
  using detail::BatchKey;
  const auto key = [](int64_t rows, const MuonOptions& o) {
    BatchKey k;
    k.rows = rows;
    k.cols = 8;
    k.options = &o;
    return k;
  };
  using G = std::vector<std::vector<size_t>>;
  EXPECT_EQ(detail::group_by_key({key(4, a), key(6, a), key(4, b), key(4, c), key(6, b)}),
            (G{{0, 2}, {1, 4}, {3}}));
  auto apart = key(4, b);
  apart.by_group = true;
  auto bf16 = key(4, a);
  bf16.dtype = at::kBFloat16;
  auto split = key(4, a);
  split.split = {1, 0};
  auto alone = key(4, a);
  alone.alone = true;
  EXPECT_EQ(detail::group_by_key({key(4, a), apart, bf16, split, alone, key(4, a)}),
            (G{{0, 5}, {1}, {2}, {3}, {4}}));
}

}  // namespace
}  // namespace muon::test
