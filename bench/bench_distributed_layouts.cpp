// Sharded (ZeRO/FSDP) and layer-wise Muon step time and traffic at world
// size 2, on the 25M-parameter set of REFERENCE.md (d = 512, 8 layers; per
// layer 1536×512, 512×512, 2048×512, 512×2048), against single-process
// muon::Muon on the whole matrices in the same run.
//
// Run it as two processes (each rank one process, one compute thread):
//
//   muon-launch -n 2 -- bench_distributed_layouts [--iters N] [--warmup N]
//
// Rank 0 first times single-process Muon with every core (--single-threads,
// default 2) and with one thread while rank 1 waits (the faster is the
// baseline); then both ranks time each layout with one thread each (the two
// processes together use the same two cores):
//   sharded owner-compute (batches in flight 2, and 0 = no overlap),
//   sharded replicated (every rank orthogonalizes every matrix),
//   layer-wise (overlapped all-gather, and not overlapped).
// Sharded layouts hold balanced row shards; layer-wise holds the whole
// (replicated) matrices. Each timed step starts at a barrier; the time is
// the slower rank's median. Bytes are muon::distributed::Group's per-rank counter
// (ring model), per step, with the minimum each layout must send.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist_bench_util.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"
#include "muon/optim/muon.h"

namespace {

using muon::distributed::Group;

constexpr int kLayers = 8;
const int64_t kShapes[4][2] = {{1536, 512}, {512, 512}, {2048, 512}, {512, 2048}};

using muon::bench::Args;
using muon::bench::median;
using muon::bench::parse_args;

std::vector<std::vector<int64_t>> shapes() {
  std::vector<std::vector<int64_t>> out;
  for (int l = 0; l < kLayers; ++l) {
    for (const auto& s : kShapes) out.push_back({s[0], s[1]});
  }
  return out;
}

at::Tensor fixed(const std::vector<int64_t>& shape, int64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape);
}

// Median seconds per step of `step` (the slower rank's), after warm-up.
double time_steps(const Group& group, const Args& a, const std::function<void()>& step) {
  for (int i = 0; i < a.warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < a.iters; ++i) {
    group.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  auto t = at::tensor({median(times)}, at::kDouble);
  const auto all = group.all_gather(t);
  double slowest = 0;
  for (const auto& x : all) slowest = std::max(slowest, x.item<double>());
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  const auto a = parse_args(argc, argv);
  auto group = muon::distributed::init_from_env();
  const int rank = group.rank();
  const int world = group.size();
  const auto all_shapes = shapes();

  // Single process on the whole matrices, rank 0 alone, with every core and
  // with one thread; the faster is the baseline.
  auto time_single = [&](int threads) {
    at::set_num_threads(threads);
    std::vector<at::Tensor> params;
    for (size_t k = 0; k < all_shapes.size(); ++k) {
      params.push_back(fixed(all_shapes[k], static_cast<int64_t>(k)).requires_grad_(true));
      params.back().mutable_grad() = fixed(all_shapes[k], 1000 + static_cast<int64_t>(k));
    }
    muon::Muon opt(params);
    for (int i = 0; i < a.warmup; ++i) opt.step();
    std::vector<double> times;
    for (int i = 0; i < a.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      opt.step();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(times);
  };
  double single_all = 0;
  double single_one = 0;
  if (rank == 0) {
    single_all = time_single(a.single_threads);
    single_one = time_single(1);
  }
  const double single = std::min(single_all, single_one);
  group.barrier();
  at::set_num_threads(1);

  if (rank == 0) {
    std::printf("world %d, %zu matrices (25M parameters), fp32 NS quintic x5\n", world, all_shapes.size());
    std::printf("single process, %d threads: %8.1f ms/step\n", a.single_threads, 1e3 * single_all);
    std::printf("single process, 1 thread:  %8.1f ms/step (vs single: the faster of the two)\n\n",
                1e3 * single_one);
    std::printf("%-28s %10s %9s %14s %14s %8s\n", "layout", "ms/step", "vs single", "MB sent/rank",
                "MB minimum", "ratio");
  }
  auto report = [&](const char* name, double seconds, double bytes, double minimum) {
    if (rank != 0) return;
    std::printf("%-28s %10.1f %8.2fx %14.2f %14.2f %8.3f\n", name, 1e3 * seconds, seconds / single,
                bytes / 1e6, minimum / 1e6, minimum > 0 ? bytes / minimum : 0.0);
    std::fflush(stdout);
  };
  // The seconds per step of opt (time_steps), then the bytes one more step sends.
  auto time_and_bytes = [&](auto& opt) {
    const double seconds = time_steps(group, a, [&] { opt.step(); });
    group.reset_bytes_sent();
    opt.step();
    return std::make_pair(seconds, static_cast<double>(group.bytes_sent()));
  };

  // Sharded: balanced row shards.
  for (const auto& [name, mode, in_flight] :
       std::vector<std::tuple<const char*, muon::distributed::ShardedMode, int64_t>>{
           {"sharded owner-compute", muon::distributed::ShardedMode::kOwnerCompute, 2},
           {"sharded owner, no overlap", muon::distributed::ShardedMode::kOwnerCompute, 0},
           {"sharded replicated", muon::distributed::ShardedMode::kReplicated, 2}}) {
    std::vector<at::Tensor> params;
    std::vector<muon::distributed::RowShard> shards;
    std::vector<std::vector<int64_t>> rows;
    for (size_t k = 0; k < all_shapes.size(); ++k) {
      rows.push_back(muon::distributed::balanced_split_sizes(all_shapes[k][0], world));
      params.push_back(muon::distributed::local_rows(fixed(all_shapes[k], static_cast<int64_t>(k)), rows.back(), rank)
                           .requires_grad_(true));
      params.back().mutable_grad() =
          muon::distributed::local_rows(fixed(all_shapes[k], 1000 + static_cast<int64_t>(k)), rows.back(), rank);
      shards.emplace_back(all_shapes[k], group);
    }
    muon::distributed::ShardedMuon opt(params, shards, {}, muon::distributed::ShardedOptions().mode(mode).max_in_flight(in_flight));
    const auto [seconds, bytes] = time_and_bytes(opt);
    // Minimum for owner-compute: my rows of matrices I do not own, out; the
    // other rows of those I own, back. Replicated: every other rank's rows
    // of every matrix arrive here (all-gather: my rows to W − 1 ranks).
    double minimum = 0;
    for (size_t k = 0; k < all_shapes.size(); ++k) {
      const double cols = static_cast<double>(all_shapes[k][1]);
      const double mine = static_cast<double>(rows[k][static_cast<size_t>(rank)]);
      const double all = static_cast<double>(all_shapes[k][0]);
      if (mode == muon::distributed::ShardedMode::kReplicated) {
        minimum += (world - 1) * mine * cols * 4;
      } else {
        minimum += (opt.owners()[k] == rank ? all - mine : mine) * cols * 4;
      }
    }
    report(name, seconds, bytes, minimum);
  }

  // Layer-wise: whole matrices on every rank; one owner updates each.
  for (const auto& [name, in_flight] : std::vector<std::pair<const char*, int64_t>>{
           {"layer-wise", 2}, {"layer-wise, no overlap", 0}}) {
    torch::OrderedDict<std::string, at::Tensor> named;
    for (size_t k = 0; k < all_shapes.size(); ++k) {
      auto p = fixed(all_shapes[k], static_cast<int64_t>(k)).requires_grad_(true);
      p.mutable_grad() = fixed(all_shapes[k], 1000 + static_cast<int64_t>(k));
      named.insert("m" + std::to_string(k), p);
    }
    muon::distributed::LayerwiseOptimizer opt(
        named, group,
        [](const torch::OrderedDict<std::string, at::Tensor>& owned) {
          return std::make_unique<muon::Muon>(owned.values());
        },
        muon::distributed::LayerwiseOptions().max_in_flight(in_flight));
    const auto [seconds, bytes] = time_and_bytes(opt);
    // Minimum: every rank's owned parameters reach every other rank once.
    double owned = 0;
    for (size_t k = 0; k < all_shapes.size(); ++k) {
      if (opt.owners()[k] == rank) owned += static_cast<double>(all_shapes[k][0] * all_shapes[k][1] * 4);
    }
    report(name, seconds, bytes, (world - 1) * owned);
  }
  return 0;
}
