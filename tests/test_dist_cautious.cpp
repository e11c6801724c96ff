// Cautious weight decay (muon_weight_decay_mode "cautious") in every layout,
// for every Muon-family entry that takes it: the mask is element-wise on
// the part a process holds, taken from that part of the final update, so
// tensor-parallel blocks (duplicated, distributed; row- or column-split,
// uneven, empty), blockwise (each block a matrix of its own), row shards
// (owner-compute and replicated, uneven, empty), the 2-D layout and
// layerwise give the parameters of one process. Built from configs through
// muon::distributed::make_optimizer; ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dist_util.h"
#include "layout_harness.h"
#include "muon/config.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/distributed/layouts/tensor_parallel.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/registry.h"

namespace muon::test {
namespace {

using muon::distributed::Group;
using muon::distributed::RowShard;
using Named = torch::OrderedDict<std::string, at::Tensor>;
using Part = std::function<at::Tensor(size_t, const at::Tensor&)>;

constexpr int64_t kSteps = 3;

// Each with the dimension tensor-parallel blocks split (layout_harness.h).
// No world size of 2–4 divides these evenly; 3 rows leave rank 3 of 4 empty.
const std::vector<layouts::Matrix> kModel{{{24, 16}, 0}, {{16, 40}, 1}, {{21, 10}, 0}, {{3, 12}, 0}};

std::string name_of(size_t k) { return "blocks." + std::to_string(k) + ".weight"; }
at::Tensor full_param(size_t k) { return seeded_randn(kModel[k].shape, 40 + k); }
at::Tensor full_grad(size_t k, int64_t step) {
  return seeded_randn(kModel[k].shape, 900 + 17 * static_cast<uint64_t>(step) + k);
}

OptimizerConfig config_of(const std::string& name, const std::string& layout) {
  OptimizerConfig c;
  c.set("optimizer", name).set("lr", 0.02).set("weight_decay", 0.5).set("layout", layout);
  c.set("muon_weight_decay_mode", "cautious");
  if (name == "muon_hyperball") c.set("muon_hyperball_radius", 5.0);
  return c;
}

using layouts::block_of;

// Tensor-parallel shards of every matrix over `group` (parts layouts::tensor_parallel_part).
muon::distributed::DistributedLayout tensor_parallel_layout(const Group& group) {
  muon::distributed::DistributedLayout layout;
  for (size_t k = 0; k < kModel.size(); ++k) {
    layout.tensor_parallel.emplace(name_of(k),
                                   muon::distributed::TensorParallelShard(kModel[k].shape, kModel[k].dim, group));
  }
  return layout;
}

Named named_model(const Part& part) {
  Named named;
  for (size_t k = 0; k < kModel.size(); ++k)
    named.insert(name_of(k), part(k, full_param(k)).requires_grad_(true));
  return named;
}

// Steps an optimizer over `named` kSteps times, each gradient the part `part`
// of the whole one.
void run_steps(torch::optim::Optimizer& opt, Named& named, const Part& part) {
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k)
      named[name_of(k)].mutable_grad() = part(k, full_grad(k, s));
    opt.step();
  }
}

// One process on the whole matrices (or, for blockwise, on `part`'s blocks
// of every world rank as matrices of their own).
std::vector<at::Tensor> single_process(const std::string& name) {
  const Part whole = [](size_t, const at::Tensor& t) { return t; };
  auto named = named_model(whole);
  auto opt = muon::make_optimizer(named, config_of(name, "none"));
  run_steps(*opt, named, whole);
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < kModel.size(); ++k) out.push_back(named[name_of(k)].detach());
  return out;
}

// The layouts differ from one process in the order of fp32 sums only (the
// Gram matrix, the norm, a stage's statistics summed over parts): a few ulps
// of each update, below 1e-5 of the parameters after three steps. The mask
// is a sign of that update, which those ulps flip only for an element whose
// update is within ulps of 0; a layout that masked with another part's
// update or decayed everywhere is off by lr·wd·|p| ~1e-2.
void expect_parts_equal(Named& named, const Part& part, const std::vector<at::Tensor>& reference,
                        const std::string& what) {
  for (size_t k = 0; k < kModel.size(); ++k) {
    const auto expected = part(k, reference[k]);
    if (expected.numel() == 0) continue;
    const double err = (named[name_of(k)].detach() - expected).abs().max().item<double>() /
                       reference[k].abs().max().item<double>();
    EXPECT_LE(err, 1e-5) << what << " matrix " << k;
  }
}

// This rank's `part` of the model, trained by run_steps with `config` under
// `layout`, equals that part of `reference` (expect_parts_equal).
void expect_trained_part(const std::vector<at::Tensor>& reference, const Part& part,
                         const muon::distributed::DistributedLayout& layout,
                         const OptimizerConfig& config, const std::string& what) {
  auto named = named_model(part);
  auto opt = muon::distributed::make_optimizer(named, config, layout);
  run_steps(*opt, named, part);
  expect_parts_equal(named, part, reference, what);
}

// body(group, world, mode) on every rank of 2, 3 and 4 thread ranks, for
// each of `modes`.
void for_modes_at_2_to_4_ranks(const std::vector<std::string>& modes,
                               const std::function<void(Group&, int, const std::string&)>& body) {
  for (const auto& mode : modes) {
    for (int world = 2; world <= 4; ++world) {
      run_ranks(world, [&](Group& group) { body(group, world, mode); });
    }
  }
}

class CautiousLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(CautiousLayouts, TensorParallelEqualsOneProcess) {
  const auto name = GetParam();
  const auto reference = single_process(name);
  for_modes_at_2_to_4_ranks(
      {"duplicated", "distributed"}, [&](Group& group, int world, const std::string& tp_mode) {
        auto config = config_of(name, "tensor_parallel");
        config.set("muon_tp_mode", tp_mode);
        expect_trained_part(reference, layouts::tensor_parallel_part(kModel, group.rank(), world),
                            tensor_parallel_layout(group), config,
                            name + " tp " + tp_mode + " world " + std::to_string(world) + " rank " +
                                std::to_string(group.rank()));
      });
}

// Blockwise: each rank's block is a matrix of its own, so one process that
// holds every block of every rank as separate matrices gives the same values.
TEST_P(CautiousLayouts, BlockwiseEqualsOneProcessOnTheBlocks) {
  const auto name = GetParam();
  const int world = 3;
  Named blocks;
  for (size_t k = 0; k < kModel.size(); ++k) {
    for (int r = 0; r < world; ++r) {
      const auto b = block_of(full_param(k), kModel[k].dim, r, world);
      if (b.numel() > 0)
        blocks.insert(name_of(k) + "." + std::to_string(r), b.requires_grad_(true));
    }
  }
  auto one = muon::make_optimizer(blocks, config_of(name, "none"));
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k) {
      for (int r = 0; r < world; ++r) {
        const auto key = name_of(k) + "." + std::to_string(r);
        if (blocks.contains(key))
          blocks[key].mutable_grad() = block_of(full_grad(k, s), kModel[k].dim, r, world);
      }
    }
    one->step();
  }
  run_ranks(world, [&](Group& group) {
    const Part part = layouts::tensor_parallel_part(kModel, group.rank(), world);
    auto named = named_model(part);
    auto layout = tensor_parallel_layout(group);
    auto config = config_of(name, "tensor_parallel");
    config.set("muon_tp_mode", "blockwise");
    auto opt = muon::distributed::make_optimizer(named, config, layout);
    run_steps(*opt, named, part);
    for (size_t k = 0; k < kModel.size(); ++k) {
      const auto key = name_of(k) + "." + std::to_string(group.rank());
      if (!blocks.contains(key)) continue;
      // The same arithmetic on the same block: identical values.
      const double err =
          (named[name_of(k)].detach() - blocks[key].detach()).abs().max().item<double>();
      EXPECT_LE(err, 1e-6 * blocks[key].detach().abs().max().item<double>())
          << name << " blockwise " << key;
    }
  });
}

TEST_P(CautiousLayouts, RowShardsEqualOneProcess) {
  const auto name = GetParam();
  const auto reference = single_process(name);
  for_modes_at_2_to_4_ranks(
      {"owner_compute", "replicated"},
      [&](Group& group, int world, const std::string& sharded_mode) {
        const Part part = [&](size_t k, const at::Tensor& t) {
          return muon::distributed::local_rows(
              t, muon::distributed::balanced_split_sizes(kModel[k].shape[0], world), group.rank());
        };
        muon::distributed::DistributedLayout layout;
        for (size_t k = 0; k < kModel.size(); ++k)
          layout.row_shards.emplace(name_of(k), RowShard(kModel[k].shape, group));
        auto config = config_of(name, "sharded");
        config.set("layout_sharded_mode", sharded_mode);
        expect_trained_part(reference, part, layout, config,
                            name + " " + sharded_mode + " world " + std::to_string(world) +
                                " rank " + std::to_string(group.rank()));
      });
}

TEST_P(CautiousLayouts, TwoDimensionalEqualsOneProcess) {
  const auto name = GetParam();
  const auto reference = single_process(name);
  run_ranks(4, [&](Group& world) {
    const auto [dp, tp] = world.mesh(2, 2);
    muon::distributed::DistributedLayout layout;
    for (size_t k = 0; k < kModel.size(); ++k) {
      layout.row_shards.emplace(
          name_of(k), layouts::two_d_shard(kModel[k], dp, tp, muon::distributed::TensorParallelMode::kDistributed));
    }
    expect_trained_part(reference, layouts::two_d_part(kModel, dp, tp), layout,
                        config_of(name, "sharded"),
                        name + " 2-D rank " + std::to_string(world.rank()));
  });
}

TEST_P(CautiousLayouts, LayerwiseEqualsOneProcess) {
  const auto name = GetParam();
  const auto reference = single_process(name);
  for (int world = 2; world <= 3; ++world) {
    run_ranks(world, [&](Group& group) {
      const Part whole = [](size_t, const at::Tensor& t) { return t; };
      auto named = named_model(whole);
      muon::distributed::DistributedLayout layout;
      layout.group = group;
      auto opt = muon::distributed::make_optimizer(named, config_of(name, "layerwise"), layout);
      run_steps(*opt, named, whole);
      // The owner runs one process's arithmetic on the same whole matrix.
      for (size_t k = 0; k < kModel.size(); ++k) {
        EXPECT_TRUE(at::equal(named[name_of(k)].detach(), reference[k]))
            << name << " layerwise world " << world << " matrix " << k;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Entries, CautiousLayouts,
                         ::testing::Values("muon", "adaptive_muon", "polargrad", "spel",
                                           "muon_hyperball"));

// The mask matters: cautious and decoupled decay give different parameters
// here, so the equalities above test the cautious arithmetic.
TEST(CautiousLayoutsModel, CautiousDiffersFromDecoupled) {
  const auto cautious = single_process("muon");
  const Part whole = [](size_t, const at::Tensor& t) { return t; };
  auto named = named_model(whole);
  auto config = config_of("muon", "none");
  config.set("muon_weight_decay_mode", "decoupled");
  auto opt = muon::make_optimizer(named, config);
  run_steps(*opt, named, whole);
  for (size_t k = 0; k < kModel.size(); ++k) {
    EXPECT_GT((named[name_of(k)].detach() - cautious[k]).abs().max().item<double>(), 1e-3) << k;
  }
}

}  // namespace
}  // namespace muon::test
