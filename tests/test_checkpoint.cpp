// Checkpoints (muon/distributed/checkpoint.h): resuming in the same layout is
// bit-identical to never stopping; resharding across world sizes and
// layouts (single process, layer-wise, sharded, tensor parallel) equals
// single-process training up to float rounding; damaged, truncated, missing
// and mixed files and other models are errors naming the file and the
// tensor, and leave model and optimizer untouched on every rank; random bit
// flips never load a different state. Ranks are threads over real Gloo
// groups; the kill loop runs real processes (test_checkpoint_kill.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "dist_util.h"
#include "distributed/checkpoint_state.h"
#include "muon/distributed/checkpoint.h"
#include "muon/distributed/make.h"
#include "muon/distributed/shard.h"
#include "muon/distributed/sharded.h"

namespace {

namespace fs = std::filesystem;
using muon::OptimizerConfig;
using muon::dist::CheckpointOptions;
using muon::dist::DistributedLayout;
using muon::dist::Group;
using muon::test::seeded_randn;
using Named = torch::OrderedDict<std::string, at::Tensor>;

// Matrices go to Muon, vectors and embeddings to AdamW (the hybrid).
const std::vector<std::pair<std::string, std::vector<int64_t>>> kModel{
    {"wte.weight", {40, 16}},       {"blocks.0.qkv.weight", {48, 16}}, {"blocks.0.norm.weight", {16}},
    {"blocks.0.fc1.weight", {64, 16}}, {"blocks.0.fc1.bias", {64}},    {"blocks.0.fc2.weight", {16, 64}},
    {"lm_head.weight", {40, 16}}};

at::Tensor full_param(size_t k) { return seeded_randn(kModel[k].second, 10 + k); }
at::Tensor full_grad(size_t k, int64_t step) { return seeded_randn(kModel[k].second, 500 + 13 * step + k); }

OptimizerConfig config(const std::string& layout, const std::string& optimizer = "muon") {
  OptimizerConfig c;
  c.set("optimizer", optimizer).set("lr", 0.02).set("weight_decay", 0.1).set("layout", layout);
  return c;
}

// One rank's model and optimizer in a layout: "none" (whole, one process),
// "layerwise" (whole, one owner per parameter), "sharded" (every tensor's
// rows split over the ranks), "tp" (the block's matrices split over the
// ranks along dim 0 (qkv, fc1) or dim 1 (fc2); the rest replicated).
struct Rank {
  Named named;
  DistributedLayout layout;
  std::unique_ptr<torch::optim::Optimizer> opt;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> local;  // whole → this rank's part
  CheckpointOptions options;

  Rank(const std::string& kind, const Group& group, const std::string& optimizer = "muon") {
    const int world = group.size();
    const int rank = group.rank();
    for (size_t k = 0; k < kModel.size(); ++k) {
      const auto& [name, shape] = kModel[k];
      std::function<at::Tensor(const at::Tensor&)> part = [](const at::Tensor& t) { return t; };
      const bool block = name.find("blocks.0.") == 0 && shape.size() == 2;
      if (kind == "sharded") {
        const auto rows = muon::dist::balanced_split_sizes(shape[0], world);
        part = [rows, rank](const at::Tensor& t) { return muon::dist::local_rows(t, rows, rank); };
        layout.row_shards.emplace(name, muon::dist::RowShard(shape, group));
      } else if (kind == "tp" && block) {
        const int64_t dim = name.find("fc2") != std::string::npos ? 1 : 0;
        const auto sizes = muon::dist::balanced_split_sizes(shape[static_cast<size_t>(dim)], world);
        const auto offset = muon::dist::split_offset(sizes, rank);
        part = [dim, offset, sizes, rank](const at::Tensor& t) {
          return t.narrow(dim, offset, sizes[static_cast<size_t>(rank)]).contiguous();
        };
        layout.tensor_parallel.emplace(name, muon::dist::TensorParallelShard(shape, dim, group));
      }
      local.push_back(part);
      named.insert(name, part(full_param(k)).requires_grad_(true));
    }
    layout.group = group;
    options.group(group);
    const auto layout_field = kind == "tp" ? "tensor_parallel" : kind;
    opt = muon::dist::make_optimizer(named, config(layout_field, optimizer), layout);
  }

  // Steps [from, to) with the whole model's gradients, each rank its part.
  void train(int64_t from, int64_t to) {
    for (int64_t s = from; s < to; ++s) {
      for (size_t k = 0; k < kModel.size(); ++k) named[kModel[k].first].mutable_grad() = local[k](full_grad(k, s));
      opt->step();
    }
  }

  std::string save(const std::string& dir, int64_t step, int64_t keep = 2) {
    auto o = options;
    return muon::dist::save_checkpoint(dir, named, *opt, step, layout, "extra " + std::to_string(step),
                                       o.keep(keep));
  }
  muon::dist::CheckpointInfo load(const std::string& dir) {
    return muon::dist::load_checkpoint(dir, named, *opt, layout, options);
  }
};

// The single-process model after `steps` steps.
Named whole_after(int64_t steps, const std::string& optimizer = "muon") {
  Named out;
  muon::test::run_ranks(1, [&](Group& g) {
    Rank r("none", g, optimizer);
    r.train(0, steps);
    out = r.named;
  });
  return out;
}

double relative(const at::Tensor& got, const at::Tensor& expected) {
  if (expected.numel() == 0) return 0;
  return (got - expected).abs().max().item<double>() / expected.abs().max().item<double>();
}

fs::path fresh_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("muon_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

// Every value of the parameters and of every optimizer state field (steps
// as tensors, a missing state or field as an empty marker), to compare
// bit for bit.
std::vector<at::Tensor> snapshot(Rank& r) {
  std::vector<at::Tensor> out;
  for (const auto& item : r.named) out.push_back(item.value().detach().clone());
  for (const auto& slot : muon::dist::detail::state_slots(*r.opt)) {
    auto* state = muon::dist::detail::find_state(slot);
    if (state == nullptr) {
      out.push_back(at::full({1}, -1.0));
      continue;
    }
    for (const auto& f : muon::dist::detail::state_fields(slot.kind, *state)) {
      if (f.integer != nullptr) {
        out.push_back(at::full({}, *f.integer, at::kLong));
      } else {
        out.push_back(f.tensor->defined() ? f.tensor->clone() : at::full({1}, -2.0));
      }
    }
  }
  return out;
}

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].scalar_type() != b[i].scalar_type() || !a[i].sizes().equals(b[i].sizes()) ||
        !at::equal(a[i], b[i])) {
      return false;
    }
  }
  return true;
}

// ---- resuming in the same layout: bit-identical -------------------------------------

class SameLayout : public ::testing::TestWithParam<std::pair<std::string, int>> {};

TEST_P(SameLayout, ResumingIsBitIdenticalToNeverStopping) {
  const auto [kind, world] = GetParam();
  const auto dir = fresh_dir("same_" + kind + std::to_string(world));
  muon::test::run_ranks(world, [&, kind = kind](Group& group) {
    Rank a(kind, group);
    a.train(0, 3);
    a.save(dir.string(), 3);
    a.train(3, 6);
    Rank b(kind, group);
    b.train(0, 1);  // different state, overwritten by the load
    const auto info = b.load(dir.string());
    EXPECT_EQ(info.step, 3);
    EXPECT_EQ(info.extra, "extra 3");
    EXPECT_EQ(info.world_size, world);
    b.train(3, 6);
    for (const auto& item : a.named) {
      EXPECT_TRUE(at::equal(item.value(), b.named[item.key()])) << kind << " " << item.key();
    }
  });
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, SameLayout,
                         ::testing::Values(std::make_pair(std::string("none"), 1),
                                           std::make_pair(std::string("layerwise"), 2),
                                           std::make_pair(std::string("sharded"), 3),
                                           std::make_pair(std::string("tp"), 2)),
                         [](const auto& info) { return info.param.first + std::to_string(info.param.second); });

// ---- resharding ------------------------------------------------------------------

// Trains steps [from, to) in `kind` at `world` ranks, starting from the
// checkpoint in `in` (none when empty) and saving to `out`; returns the
// whole parameters (gathered from rank 0's view when sharded is not needed:
// each rank checks its own part against `reference`).
void leg(const std::string& kind, int world, const std::string& in, const std::string& out, int64_t from,
         int64_t to, const Named& reference, const std::string& what) {
  muon::test::run_ranks(world, [&](Group& group) {
    Rank r(kind, group);
    if (!in.empty()) {
      EXPECT_EQ(r.load(in).step, from) << what;
    }
    r.train(from, to);
    r.save(out, to);
    if (reference.is_empty()) return;
    for (size_t k = 0; k < kModel.size(); ++k) {
      const auto& name = kModel[k].first;
      // Sharded and layer-wise steps are the same computation up to BLAS
      // summation order; 1e-5 of the largest element, as the layout tests.
      EXPECT_LE(relative(r.named[name].detach(), r.local[k](reference[name].detach())), 1e-5)
          << what << " " << name << " rank " << group.rank();
    }
  });
}

TEST(Checkpoint, ReshardsAcrossWorldSizesAndLayouts) {
  const auto reference = whole_after(6);
  const auto dir = fresh_dir("reshard");
  const auto d = [&](const char* leg_name) { return (dir / leg_name).string(); };
  // 4 → 2 → 1 → 3, through sharded, layer-wise, single and back to sharded.
  leg("sharded", 4, "", d("a"), 0, 2, {}, "sharded W=4");
  leg("layerwise", 2, d("a"), d("b"), 2, 3, {}, "layer-wise W=2 from sharded W=4");
  leg("none", 1, d("b"), d("c"), 3, 4, {}, "single from layer-wise W=2");
  leg("sharded", 3, d("c"), d("e"), 4, 5, {}, "sharded W=3 from single");
  leg("layerwise", 3, d("e"), d("f"), 5, 6, reference, "layer-wise W=3 from sharded W=3");
  leg("none", 1, d("f"), d("g"), 6, 6, reference, "single from layer-wise W=3");
  fs::remove_all(dir);
}

TEST(Checkpoint, ReshardsTensorParallelToOneProcess) {
  const auto reference = whole_after(4);
  const auto dir = fresh_dir("tp");
  leg("tp", 2, "", (dir / "a").string(), 0, 2, {}, "TP 2");
  leg("none", 1, (dir / "a").string(), (dir / "b").string(), 2, 4, reference, "TP 1 from TP 2");
  leg("tp", 2, (dir / "b").string(), (dir / "c").string(), 4, 4, {}, "TP 2 from TP 1");
  leg("sharded", 2, (dir / "c").string(), (dir / "d").string(), 4, 4, whole_after(4), "sharded from TP 2");
  fs::remove_all(dir);
}

}  // namespace
