// Tensor-parallel Muon across real processes: every rank steps its blocks of
// a row-split (25×40) and a column-split (24×41) matrix with
// TensorParallelMuon and compares them with single-process muon::Muon on the
// whole matrices, computed locally from the same seeds.
//
//   tp_muon_check [duplicated|distributed]   (default distributed)
//
// Prints "rank R of N: tp <mode> max rel err E ok" and exits 0, or exits 1.
// rel = max|p − p_ref| / max|p_ref − p0| (as tests/test_dist_tensor_parallel.cpp).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/runtime/group.h"
#include "muon/optim/muon.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "distributed";
  auto world = muon::distributed::init_from_env(
      muon::distributed::GroupOptions().timeout(std::chrono::seconds(60)));
  const std::vector<std::vector<int64_t>> shapes = {{25, 40}, {24, 41}};
  const std::vector<int64_t> dims = {0, 1};
  constexpr int kSteps = 3;
  const auto options = muon::MuonOptions(0.05).scale_mode(muon::ScaleMode::kSpectral);

  at::manual_seed(0);
  std::vector<at::Tensor> p0;
  std::vector<std::vector<at::Tensor>> grads(kSteps);
  for (const auto& s : shapes) p0.push_back(at::randn(s) * 0.1);
  for (auto& g : grads) {
    for (const auto& s : shapes) g.push_back(at::randn(s));
  }

  // Single process on the whole matrices.
  std::vector<at::Tensor> whole;
  for (const auto& p : p0) whole.push_back(p.clone().set_requires_grad(true));
  muon::Muon ref(whole, options);
  // This rank's blocks.
  std::vector<at::Tensor> blocks;
  std::vector<std::vector<int64_t>> sizes;
  muon::distributed::TensorParallelOptions tpo;
  tpo.mode(mode);
  auto block = [&](const at::Tensor& t, size_t i) {
    return t.narrow(dims[i], muon::distributed::split_offset(sizes[i], world.rank()),
                    sizes[i][static_cast<size_t>(world.rank())])
        .contiguous();
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    sizes.push_back(muon::distributed::balanced_split_sizes(shapes[i][static_cast<size_t>(dims[i])],
                                                     world.size()));
    blocks.push_back(block(p0[i], i).set_requires_grad(true));
    tpo.shard(blocks.back(), muon::distributed::TensorParallelShard(shapes[i], dims[i], world));
  }
  muon::distributed::TensorParallelMuon tp(blocks, options, tpo);
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      whole[i].mutable_grad() = grads[static_cast<size_t>(s)][i];
      blocks[i].mutable_grad() = block(grads[static_cast<size_t>(s)][i], i);
    }
    ref.step();
    tp.step();
  }
  double worst = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto r = block(whole[i].detach(), i);
    const double change = (whole[i].detach() - p0[i]).abs().max().item<double>();
    worst = std::max(worst, (blocks[i].detach() - r).abs().max().item<double>() / change);
  }
  const bool ok = worst <= 1e-5;
  std::printf("rank %d of %d: tp %s max rel err %.3g %s\n", world.rank(), world.size(),
              mode.c_str(), worst, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
