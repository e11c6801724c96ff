// PolarGrad, Scion, MOP, SPEL and MuonHyperball (muon::OrthogonalizedVariant)
// in the distributed layouts. PolarGrad's ⟨O, M⟩ and MuonHyperball's norms
// (of the update, of the weight before and after it, and at construction)
// are summed over the parts of a matrix through the layout's strategy,
// SPEL's Newton–Schulz of the weight runs through the strategy, and Scion's
// scale depends on the whole matrix's shape, so tensor-parallel blocks (row- or column-split, uneven, empty),
// row shards (owner-compute and replicated, uneven, padded, empty), the 2-D
// layout and layerwise all give the parameters of one process. MOP's SVD
// needs whole matrices: layerwise equals one process, and the layouts that
// split matrices raise naming MOP and the layout. Ranks are threads over
// real Gloo groups, world sizes 1–4.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist_util.h"
#include "expect_util.h"
#include "layout_harness.h"
#include "muon/distributed/layouts/make.h"
#include "muon/optim/orthogonalized_family.h"
#include "muon/registry.h"

namespace muon::test {
namespace {

using muon::distributed::Group;
using muon::distributed::RowShard;
using layouts::block_of;
using layouts::full_grad;
using layouts::full_param;
using layouts::kSteps;
using torch::optim::OptimizerParamGroup;

// The harness's matrices (layout_harness.h): sizes no world size of 2–4
// divides evenly; 3 rows leave rank 3 of 4 empty.
const auto& kModel = layouts::kMatrices;

MuonOptions options(OrthogonalizedKind kind) {
  auto o = MuonOptions(0.01).nesterov(kind != OrthogonalizedKind::kScion).weight_decay(0.1);
  if (kind == OrthogonalizedKind::kScion) o.weight_decay(1.0).lr(0.02);
  return o;
}

OrthogonalizedVariantOptions variant(OrthogonalizedKind kind) {
  // MuonHyperball with a radius: construction rescales each weight by its
  // norm summed over the parts (collective), as every step does.
  return OrthogonalizedVariantOptions().kind(kind).spectral_radius(2.0).hyperball_radius(5.0);
}

layouts::Factory variant_of(OrthogonalizedKind kind) {
  return [kind](const std::vector<at::Tensor>& params,
                std::shared_ptr<Orthogonalizer> o) -> std::unique_ptr<torch::optim::Optimizer> {
    if (!o) return std::make_unique<OrthogonalizedVariant>(params, options(kind), variant(kind));
    return std::make_unique<OrthogonalizedVariant>(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)},
                                                   options(kind), variant(kind), o);
  };
}

// The layouts differ from one process only in the order of fp32 sums (the
// Gram matrix, the norm, ⟨O, M⟩ summed over parts): a few ulps of each
// update, far below 1e-5 of the parameters after three steps, while a stage
// that used a part's own ⟨O, M⟩ or shape is off by a fraction of the update
// (~1e-3 here).
constexpr double kTolerance = 1e-5;

class SplitLayouts : public ::testing::TestWithParam<OrthogonalizedKind> {};

TEST_P(SplitLayouts, TensorParallelEqualsOneProcess) {
  const auto kind = GetParam();
  const auto reference = layouts::single_process(variant_of(kind));
  layouts::expect_tensor_parallel_equal(variant_of(kind), reference, kTolerance, to_string(kind));
}

TEST_P(SplitLayouts, RowShardsEqualOneProcess) {
  const auto kind = GetParam();
  const auto reference = layouts::single_process(variant_of(kind));
  layouts::expect_row_shards_equal(variant_of(kind), reference, kTolerance, to_string(kind));
}

TEST_P(SplitLayouts, TwoDimensionalEqualsOneProcess) {
  const auto kind = GetParam();
  const auto reference = layouts::single_process(variant_of(kind));
  layouts::expect_two_dimensional_equal(variant_of(kind), reference, kTolerance, to_string(kind),
                                        {muon::distributed::TensorParallelMode::kDistributed});
}

INSTANTIATE_TEST_SUITE_P(Kinds, SplitLayouts,
                         ::testing::Values(OrthogonalizedKind::kPolarGrad, OrthogonalizedKind::kScion,
                                           OrthogonalizedKind::kSpel, OrthogonalizedKind::kMuonHyperball),
                         [](const auto& info) { return to_string(info.param); });

// The config's optimizer over named matrices (no 1-D, embedding or head
// names, so every one goes to the variant).
torch::OrderedDict<std::string, at::Tensor> named_model(
    const std::function<at::Tensor(size_t, const at::Tensor&)>& part = nullptr) {
  torch::OrderedDict<std::string, at::Tensor> named;
  for (size_t k = 0; k < kModel.size(); ++k) {
    const auto whole = full_param(k);
    named.insert("blocks." + std::to_string(k) + ".weight",
                 (part ? part(k, whole) : whole).requires_grad_(true));
  }
  return named;
}

OptimizerConfig config_of(const std::string& name, const std::string& layout) {
  OptimizerConfig c;
  c.set("optimizer", name).set("lr", 0.01).set("weight_decay", 0.1).set("layout", layout);
  if (name == "scion") c.set("scion_spectral_radius", 2.0);
  if (name == "muon_hyperball") c.set("muon_hyperball_radius", 5.0);
  return c;
}

class Layerwise : public ::testing::TestWithParam<std::string> {};

// Layerwise: each owner steps whole matrices with the entry's own factory
// (MOP's SVD included) and all-gathers them.
TEST_P(Layerwise, EqualsOneProcess) {
  const auto name = GetParam();
  auto single = named_model();
  auto one = muon::make_optimizer(single, config_of(name, "none"));
  std::vector<at::Tensor> built;  // MuonHyperball: rescaled to its radius when built
  for (const auto& item : single) built.push_back(item.value().detach().clone());
  for (int64_t s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k) single[k].value().mutable_grad() = full_grad(k, s);
    one->step();
  }
  for (int world = 2; world <= 3; ++world) {
    run_ranks(world, [&](Group& group) {
      auto named = named_model();
      muon::distributed::DistributedLayout layout;
      layout.group = group;
      auto opt = muon::distributed::make_optimizer(named, config_of(name, "layerwise"), layout);
      for (size_t k = 0; k < kModel.size(); ++k) {
        // Every rank starts from the weights one process starts from.
        EXPECT_TRUE(at::equal(named[k].value().detach(), built[k]))
            << name << " layerwise world " << world << " rank " << group.rank() << " matrix " << k << " when built";
      }
      for (int64_t s = 0; s < kSteps; ++s) {
        for (size_t k = 0; k < kModel.size(); ++k) named[k].value().mutable_grad() = full_grad(k, s);
        opt->step();
      }
      for (size_t k = 0; k < kModel.size(); ++k) {
        // The owner runs the single process's arithmetic on the same whole matrix.
        EXPECT_TRUE(at::equal(named[k].value().detach(), single[k].value().detach()))
            << name << " layerwise world " << world << " matrix " << k;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, Layerwise,
                         ::testing::Values("polargrad", "scion", "mop", "spel", "muon_hyperball"));

// MOP's SVD cannot run on parts of a matrix: the layouts that split them
// raise naming MOP and the layout, on every rank, before any step.
TEST(MopLayouts, SplitLayoutsRaiseNamingTheLayout) {
  run_ranks(2, [&](Group& group) {
    auto named = named_model(
        [&](size_t k, const at::Tensor& t) { return block_of(t, kModel[k].dim, group.rank(), 2); });
    muon::distributed::DistributedLayout tp;
    tp.group = group;
    for (size_t k = 0; k < kModel.size(); ++k) {
      tp.tensor_parallel.emplace(named[k].key(), muon::distributed::TensorParallelShard(kModel[k].shape, kModel[k].dim, group));
    }
    expect_value_error([&] { muon::distributed::make_optimizer(named, config_of("mop", "tensor_parallel"), tp); },
                       {"[muon::MOP]", "'tensor_parallel'", "whole matrices"});
    named = named_model([&](size_t k, const at::Tensor& t) {
      return muon::distributed::local_rows(t, muon::distributed::balanced_split_sizes(kModel[k].shape[0], 2), group.rank());
    });
    muon::distributed::DistributedLayout rows;
    rows.group = group;
    for (size_t k = 0; k < kModel.size(); ++k) rows.row_shards.emplace(named[k].key(), RowShard(kModel[k].shape, group));
    expect_value_error([&] { muon::distributed::make_optimizer(named, config_of("mop", "sharded"), rows); },
                       {"[muon::MOP]", "'sharded'", "whole matrices"});
  });
}

}  // namespace
}  // namespace muon::test
