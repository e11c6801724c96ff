// Tensor-parallel Muon step time and traffic at TP world size 2, on the
// 25M-parameter set of REFERENCE.md (d = 512, 8 layers; per layer QKV
// 1536×512 and fc1 2048×512 split on dim 0 as column-parallel layers, proj
// 512×512 and fc2 512×2048 split on dim 1 as row-parallel ones), against
// single-process muon::Muon on the whole matrices in the same run.
//
// Run it as two processes (each rank one process, one compute thread):
//
//   muon-launch -n 2 -- bench_tensor_parallel [--iters N] [--warmup N]
//
// Rank 0 first times single-process Muon on the whole matrices with every
// core (--single-threads, default 2) while rank 1 waits, and with one
// thread; then both ranks time each TP mode with one thread each (the two
// processes together use the same two cores). Each timed step starts at a
// barrier; the reported time is the slower rank's median. Bytes are the
// per-rank counter of muon::distributed::Group (ring model), per step.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dist_bench_util.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/runtime/group.h"
#include "muon/optim/muon.h"

namespace {

struct Matrix {
  const char* name;
  int64_t rows;
  int64_t cols;
  int64_t dim;  // TP partition dim
};

constexpr int kLayers = 8;
const Matrix kLayer[] = {
    {"qkv", 1536, 512, 0}, {"proj", 512, 512, 1}, {"fc1", 2048, 512, 0}, {"fc2", 512, 2048, 1}};

using muon::bench::Args;
using muon::bench::median;
using muon::bench::parse_args;

// Parameters with fixed synthetic gradients: whole matrices (tp == nullptr)
// or this rank's blocks.
std::vector<at::Tensor> make_params(const muon::distributed::Group* tp) {
  std::vector<at::Tensor> params;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (const auto& m : kLayer) {
      auto p = at::randn({m.rows, m.cols}) * 0.02;
      auto g = at::randn({m.rows, m.cols});
      if (tp != nullptr) {
        const int64_t total = m.dim == 0 ? m.rows : m.cols;
        const auto sizes = muon::distributed::balanced_split_sizes(total, tp->size());
        const auto off = muon::distributed::split_offset(sizes, tp->rank());
        p = p.narrow(m.dim, off, sizes[static_cast<size_t>(tp->rank())]).contiguous();
        g = g.narrow(m.dim, off, sizes[static_cast<size_t>(tp->rank())]).contiguous();
      }
      p.set_requires_grad(true);
      p.mutable_grad() = g;
      params.push_back(p);
    }
  }
  return params;
}

// Median step time in seconds; `sync` runs before every step.
template <typename Opt, typename Sync>
double time_steps(Opt& opt, const Args& a, Sync&& sync) {
  for (int i = 0; i < a.warmup; ++i) {
    sync();
    opt.step();
  }
  std::vector<double> times;
  for (int i = 0; i < a.iters; ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  auto world = muon::distributed::init_from_env(
      muon::distributed::GroupOptions().timeout(std::chrono::minutes(10)));
  const bool lead = world.rank() == 0;
  const auto options = muon::MuonOptions(0.02);  // quintic ×5, fp32, shape scaling

  double single_all = 0;
  double single_one = 0;
  if (lead) {
    at::set_num_threads(args.single_threads);
    auto params = make_params(nullptr);
    muon::Muon opt(params, options);
    single_all = time_steps(opt, args, [] {});
    at::set_num_threads(1);
    single_one = time_steps(opt, args, [] {});
  }
  world.barrier();
  at::set_num_threads(1);

  if (lead) {
    std::printf("TP Muon step, 25M-parameter set (32 matrices), TP world size %d over %s\n",
                world.size(), world.backend_name().c_str());
    std::printf("median of %d steps after %d warm-up\n\n", args.iters, args.warmup);
    std::printf("%-34s %10s %12s %14s\n", "variant", "step ms", "vs single", "MB sent/rank");
    std::printf("%-34s %10.1f %12s %14s\n",
                ("single process, " + std::to_string(args.single_threads) + " threads").c_str(),
                single_all * 1e3, "1.00", "0");
    std::printf("%-34s %10.1f %12.2f %14s\n", "single process, 1 thread", single_one * 1e3,
                single_one / single_all, "0");
  }
  for (const auto mode : {muon::distributed::TensorParallelMode::kDuplicated,
                          muon::distributed::TensorParallelMode::kDistributed,
                          muon::distributed::TensorParallelMode::kBlockwise}) {
    auto params = make_params(&world);
    muon::distributed::TensorParallelOptions tpo;
    tpo.mode(mode);
    size_t k = 0;
    for (int layer = 0; layer < kLayers; ++layer) {
      for (const auto& m : kLayer) {
        tpo.shard(params[k++], muon::distributed::TensorParallelShard({m.rows, m.cols}, m.dim, world));
      }
    }
    muon::distributed::TensorParallelMuon opt(params, options, tpo);
    world.barrier();
    world.reset_bytes_sent();
    const double t = time_steps(opt, args, [&] { world.barrier(); });
    const double mb = static_cast<double>(world.bytes_sent()) / (args.iters + args.warmup) / 1e6;
    // The slower rank's median.
    auto both = at::zeros({world.size()}, at::kDouble);
    both[world.rank()] = t;
    world.all_reduce_(both);
    const double slow = both.max().item<double>();
    if (lead) {
      std::printf("%-34s %10.1f %12.2f %14.1f\n",
                  ("TP " + muon::distributed::to_string(mode) + ", 1 thread/rank").c_str(), slow * 1e3,
                  slow / single_all, mb);
    }
  }
  world.barrier();
  return 0;
}
