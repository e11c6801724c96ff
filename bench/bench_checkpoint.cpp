// Checkpoint save and load time and bytes per rank, muon::distributed checkpoints
// against torch::serialize archives of the same state, on the 25M-parameter
// set of REFERENCE.md (d = 512, 8 layers; per layer 1536×512, 512×512,
// 2048×512, 512×2048), sharded Muon (balanced row shards) at the launcher's
// world size:
//
//   bench_checkpoint [--iters N] [--warmup N]                 # one process
//   muon-launch -n 4 -- bench_checkpoint [--iters N]          # 4 ranks
//
// Files go to $MUON_BENCH_DIR (default /var/tmp/muon-bench-checkpoint),
// removed at the end. Each rank holds its rows of every matrix and their
// momentum (one step taken). Timed, each from a barrier, the slower rank's
// median:
//   muon save         save_checkpoint (XXH3 per chunk, fsync, manifest commit)
//   muon save, no fsync
//   muon load         load_checkpoint into the same layout (verifies every chunk)
//   torch save        OutputArchive with the rank's parameters and opt.save, save_to
//   torch load        InputArchive load_from, parameters copied, opt.load
// Loads read files the save just wrote (in the page cache).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "dist_bench_util.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/distributed/runtime/group.h"

namespace {

namespace fs = std::filesystem;
using muon::distributed::Group;

constexpr int kLayers = 8;
const int64_t kShapes[4][2] = {{1536, 512}, {512, 512}, {2048, 512}, {512, 2048}};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median seconds of `run(i)` (the slower rank's), after warm-up.
double time_it(const Group& group, const muon::bench::Args& a, const std::function<void(int)>& run) {
  for (int i = 0; i < a.warmup; ++i) run(-1 - i);
  std::vector<double> times;
  for (int i = 0; i < a.iters; ++i) {
    group.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    run(i);
    times.push_back(seconds_since(t0));
  }
  auto t = at::tensor({muon::bench::median(times)}, at::kDouble);
  double slowest = 0;
  for (const auto& x : group.all_gather(t)) slowest = std::max(slowest, x.item<double>());
  return slowest;
}

int64_t max_over(const Group& group, int64_t v) {
  int64_t m = 0;
  for (const auto& x : group.all_gather_ints({v})) m = std::max(m, x[0]);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const auto a = muon::bench::parse_args(argc, argv);
  const bool launched = std::getenv("RANK") != nullptr;
  auto group = launched ? muon::distributed::init_from_env() : Group::single();
  at::set_num_threads(1);
  const int rank = group.rank();
  const int world = group.size();
  const char* env_dir = std::getenv("MUON_BENCH_DIR");
  const fs::path root = env_dir != nullptr ? env_dir : "/var/tmp/muon-bench-checkpoint";
  if (rank == 0) fs::remove_all(root);
  group.barrier();

  torch::OrderedDict<std::string, at::Tensor> named;
  muon::distributed::DistributedLayout layout;
  layout.group = group;
  int64_t parameters = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (int s = 0; s < 4; ++s) {
      const std::vector<int64_t> shape{kShapes[s][0], kShapes[s][1]};
      const auto name = "layers." + std::to_string(l) + ".w" + std::to_string(s);
      const auto rows = muon::distributed::balanced_split_sizes(shape[0], world);
      at::manual_seed(l * 4 + s);
      auto p = muon::distributed::local_rows(at::randn(shape), rows, rank).requires_grad_(true);
      p.mutable_grad() = at::randn_like(p);
      parameters += shape[0] * shape[1];
      named.insert(name, p);
      layout.row_shards.emplace(name, muon::distributed::RowShard(shape, group));
    }
  }
  muon::OptimizerConfig config;
  config.set("optimizer", "muon").set("layout", world > 1 ? "sharded" : "none");
  auto opt = muon::distributed::make_optimizer(named, config, layout);
  opt->step();  // momentum buffers exist, so torch::serialize stores them too

  muon::distributed::CheckpointOptions options;
  options.group(group).keep(1);
  const auto muon_dir = (root / "muon").string();
  auto save = [&](bool sync) {
    auto o = options;
    o.fsync(sync);
    return [&, o](int i) { muon::distributed::save_checkpoint(muon_dir, named, *opt, 100 + i, layout, "", o); };
  };
  const double muon_save = time_it(group, a, save(true));
  const double muon_save_nosync = time_it(group, a, save(false));
  const auto info = muon::distributed::latest_checkpoint(muon_dir);
  const double muon_load = time_it(group, a, [&](int) {
    muon::distributed::load_checkpoint(muon_dir, named, *opt, layout, options);
  });
  int64_t muon_bytes = 0;
  for (const auto& e : fs::directory_iterator(info->path)) {
    const auto name = e.path().filename().string();
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "rank-%05d-", rank);
    if (name.rfind(prefix, 0) == 0) muon_bytes = static_cast<int64_t>(fs::file_size(e.path()));
  }
  const auto manifest_bytes = static_cast<int64_t>(fs::file_size(fs::path(info->path) / "manifest.json"));

  const auto torch_path = (root / ("torch.rank" + std::to_string(rank))).string();
  fs::create_directories(root);
  const double torch_save = time_it(group, a, [&](int) {
    torch::serialize::OutputArchive archive;
    for (const auto& item : named) archive.write(item.key(), item.value().detach());
    torch::serialize::OutputArchive opt_archive(archive.compilation_unit());
    opt->save(opt_archive);
    archive.write("optimizer", opt_archive);
    archive.save_to(torch_path);
  });
  const double torch_load = time_it(group, a, [&](int) {
    torch::serialize::InputArchive archive;
    archive.load_from(torch_path);
    at::NoGradGuard no_grad;
    for (const auto& item : named) {
      at::Tensor t;
      archive.read(item.key(), t);
      item.value().copy_(t);
    }
    torch::serialize::InputArchive opt_archive;
    archive.read("optimizer", opt_archive);
    opt->load(opt_archive);
  });
  const auto torch_bytes = static_cast<int64_t>(fs::file_size(torch_path));
  const auto muon_max = max_over(group, muon_bytes);
  const auto torch_max = max_over(group, torch_bytes);
  if (rank == 0) {
    std::printf("world %d, %lld parameters (32 matrices, sharded Muon: rows + momentum), median of %d\n", world,
                static_cast<long long>(parameters), a.iters);
    std::printf("%-26s %10s %12s %10s\n", "", "seconds", "vs torch", "MB/rank");
    std::printf("%-26s %10.3f %11.2fx %10.1f\n", "muon save (fsync)", muon_save, muon_save / torch_save,
                static_cast<double>(muon_max) / 1e6);
    std::printf("%-26s %10.3f %11.2fx\n", "muon save (no fsync)", muon_save_nosync, muon_save_nosync / torch_save);
    std::printf("%-26s %10.3f %11.2fx\n", "muon load (verified)", muon_load, muon_load / torch_load);
    std::printf("%-26s %10.3f %11s %10.1f\n", "torch::serialize save", torch_save, "1.00x",
                static_cast<double>(torch_max) / 1e6);
    std::printf("%-26s %10.3f %11s\n", "torch::serialize load", torch_load, "1.00x");
    std::printf("manifest: %lld bytes (rank 0)\n", static_cast<long long>(manifest_bytes));
  }
  group.barrier();
  if (rank == 0) fs::remove_all(root);
  return 0;
}
