// make_optimizer for the distributed layouts: the config's `layout` field
// builds layer-wise, sharded and tensor-parallel optimizers that equal the
// single-process optimizer of the same config; errors for missing layout
// information. Ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <thread>
#include <type_traits>
#include <string>
#include <vector>

#include "archive_util.h"
#include "dist_util.h"
#include "expect_util.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/layouts/tensor_parallel_shard.h"
#include "muon/groups.h"

namespace {

using muon::OptimizerConfig;
using muon::distributed::DistributedLayout;
using muon::distributed::Group;
using Named = torch::OrderedDict<std::string, at::Tensor>;

const std::vector<std::pair<std::string, std::vector<int64_t>>> kModel{
    {"wte.weight", {40, 16}},          {"blocks.0.qkv.weight", {48, 16}},
    {"blocks.0.norm.weight", {16}},    {"blocks.0.fc1.weight", {64, 16}},
    {"blocks.0.fc1.bias", {64}},       {"blocks.0.fc2.weight", {16, 64}},
    {"lm_head.weight", {40, 16}}};

using muon::test::seeded_randn;

at::Tensor full_param(size_t k) { return seeded_randn(kModel[k].second, 10 + k); }
at::Tensor full_grad(size_t k, int64_t step) { return seeded_randn(kModel[k].second, 500 + 13 * step + k); }

// A config with a rule per kind: the qkv matrix gets its own lr.
OptimizerConfig config(const std::string& layout) {
  OptimizerConfig c;
  c.set("optimizer", "muon").set("lr", 0.02).set("weight_decay", 0.1).set("layout", layout);
  c.set("muon_scale_mode", "shape_scaling");
  c.add_override(muon::OverrideRule().match_name("*.qkv.*").set("lr", 0.01));
  return c;
}

Named whole_after(int64_t steps, const OptimizerConfig& c = config("none")) {
  Named named;
  for (size_t k = 0; k < kModel.size(); ++k) named.insert(kModel[k].first, full_param(k).requires_grad_(true));
  auto opt = muon::make_optimizer(named, c);
  for (int64_t s = 0; s < steps; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k) named[kModel[k].first].mutable_grad() = full_grad(k, s);
    opt->step();
  }
  return named;
}

double relative(const at::Tensor& got, const at::Tensor& expected, const at::Tensor& whole) {
  if (expected.numel() == 0) return 0;
  return (got - expected).abs().max().item<double>() / whole.abs().max().item<double>();
}

// Runs `c` for 3 steps on this rank's part of the model in `layout_kind`
// and checks every parameter against the same part of `reference` (the
// single-process result). sharded: every tensor split by rows, each matrix a
// RowShard; tensor_parallel: the block's matrices split column-parallel
// (dim 0), everything else replicated; layerwise: every tensor whole.
void expect_layout_equals(const Named& reference, const OptimizerConfig& c,
                          const std::string& layout_kind, Group& group, const std::string& what) {
  Named named;
  DistributedLayout layout;
  std::vector<std::vector<int64_t>> rows(kModel.size());
  for (size_t k = 0; k < kModel.size(); ++k) {
    const bool matrix = kModel[k].second.size() == 2;
    const bool block_matrix = matrix && kModel[k].first.find("blocks.0.") == 0;
    auto p = full_param(k);
    if (layout_kind == "sharded" || (block_matrix && layout_kind != "layerwise")) {
      rows[k] = muon::distributed::balanced_split_sizes(kModel[k].second[0], 2);
      p = muon::distributed::local_rows(p, rows[k], group.rank());
    }
    if (layout_kind == "sharded" && matrix) {
      layout.row_shards.emplace(kModel[k].first, muon::distributed::RowShard(kModel[k].second, group));
    } else if (layout_kind == "tensor_parallel" && block_matrix) {
      layout.tensor_parallel.emplace(kModel[k].first, muon::distributed::TensorParallelShard(kModel[k].second, 0, group));
    }
    named.insert(kModel[k].first, p.requires_grad_(true));
  }
  if (layout_kind == "layerwise") layout.group = group;  // whole tensors, one owner each
  auto opt = muon::distributed::make_optimizer(named, c, layout);
  for (int64_t s = 0; s < 3; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k) {
      named[kModel[k].first].mutable_grad() =
          muon::test::rows_or_whole(full_grad(k, s), rows[k], group.rank());
    }
    opt->step();
  }
  // As the layer-wise test: the same computation up to summation order.
  for (size_t k = 0; k < kModel.size(); ++k) {
    const auto& whole = reference[kModel[k].first];
    const auto expected = muon::test::rows_or_whole(whole.detach(), rows[k], group.rank());
    EXPECT_LE(relative(named[kModel[k].first].detach(), expected, whole), 1e-5) << what << " " << kModel[k].first;
  }
}

TEST(DistMake, LayerwiseFromTheConfigEqualsSingleProcess) {
  const auto reference = whole_after(3);
  for (const int world : {2, 3}) {
    muon::test::run_ranks(world, [&](Group& group) {
      Named named;
      for (size_t k = 0; k < kModel.size(); ++k) named.insert(kModel[k].first, full_param(k).requires_grad_(true));
      DistributedLayout layout;
      layout.group = group;
      // The qkv rule matches nothing on ranks that do not own qkv: allowed here.
      auto opt = muon::distributed::make_optimizer(named, config("layerwise"), layout);
      EXPECT_NE(dynamic_cast<muon::distributed::LayerwiseOptimizer*>(opt.get()), nullptr);
      for (int64_t s = 0; s < 3; ++s) {
        for (size_t k = 0; k < kModel.size(); ++k) named[kModel[k].first].mutable_grad() = full_grad(k, s);
        opt->step();
      }
      // Same code on the same data by one owner per parameter; 1e-5 covers
      // only BLAS summation order.
      for (const auto& item : reference) {
        EXPECT_LE(relative(named[item.key()].detach(), item.value().detach(), item.value()), 1e-5)
            << item.key() << " rank " << group.rank();
      }
    });
  }
}

TEST(DistMake, ShardedFromTheConfigEqualsSingleProcess) {
  const auto reference = whole_after(3);
  muon::test::run_ranks(2, [&](Group& group) {
    expect_layout_equals(reference, config("sharded"), "sharded", group, "sharded");
  });
}

TEST(DistMake, TensorParallelFromTheConfigEqualsSingleProcess) {
  const auto reference = whole_after(3);
  for (const std::string mode : {"duplicated", "distributed"}) {
    muon::test::run_ranks(2, [&](Group& group) {
      auto c = config("tensor_parallel");
      c.set("muon_tp_mode", mode);
      expect_layout_equals(reference, c, "tensor_parallel", group, mode);
    });
  }
}

TEST(DistMake, LayerwiseSaveLoadThroughTheConfig) {
  muon::test::run_ranks(2, [&](Group& group) {
    DistributedLayout layout;
    layout.group = group;
    auto make_named = [] {
      Named named;
      for (size_t k = 0; k < kModel.size(); ++k) named.insert(kModel[k].first, full_param(k).requires_grad_(true));
      return named;
    };
    auto straight = make_named();
    auto a = muon::distributed::make_optimizer(straight, config("layerwise"), layout);
    auto resumed = make_named();
    auto b = muon::distributed::make_optimizer(resumed, config("layerwise"), layout);
    for (int64_t s = 0; s < 4; ++s) {
      for (size_t k = 0; k < kModel.size(); ++k) straight[kModel[k].first].mutable_grad() = full_grad(k, s);
      a->step();
    }
    for (int64_t s = 0; s < 2; ++s) {
      for (size_t k = 0; k < kModel.size(); ++k) resumed[kModel[k].first].mutable_grad() = full_grad(k, s);
      b->step();
    }
    const auto archive = muon::test::save_to_string(*b);
    auto c = muon::distributed::make_optimizer(resumed, config("layerwise"), layout);
    muon::test::load_from_string(*c, archive);
    for (int64_t s = 2; s < 4; ++s) {
      for (size_t k = 0; k < kModel.size(); ++k) resumed[kModel[k].first].mutable_grad() = full_grad(k, s);
      c->step();
    }
    for (const auto& item : straight) EXPECT_TRUE(at::equal(item.value(), resumed[item.key()])) << item.key();
  });
}

// adaptive_muon from the config in the sharded, tensor-parallel and
// layerwise layouts: AdaptiveMuon with the layout's strategy, its second
// moment on each rank's part (layerwise: on the owner's whole matrix),
// equal to one process (the bound of the other layouts here).
TEST(DistMake, AdaptiveMuonInTheShardedAndTensorParallelLayouts) {
  for (const std::string mode : {"normuon", "adamuon", "namo"}) {
    auto adaptive = [&](const std::string& layout) {
      auto c = config(layout);
      c.set("optimizer", "adaptive_muon").set("adaptive_muon_mode", mode);
      if (layout == "tensor_parallel") c.set("muon_tp_mode", "distributed");
      return c;
    };
    const auto reference = whole_after(3, adaptive("none"));
    for (const std::string layout_kind : {"sharded", "tensor_parallel", "layerwise"}) {
      muon::test::run_ranks(2, [&](Group& group) {
        expect_layout_equals(reference, adaptive(layout_kind), layout_kind, group, mode + " " + layout_kind);
      });
    }
  }
}

TEST(DistMake, MissingLayoutInformationIsAnError) {
  Named named;
  for (size_t k = 0; k < kModel.size(); ++k) named.insert(kModel[k].first, full_param(k).requires_grad_(true));
  auto expect_error = [](const std::function<void()>& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  // layerwise without a group; sharded without row shards; a shard of no parameter.
  expect_error([&] { muon::distributed::make_optimizer(named, config("layerwise"), {}); }, "group");
  expect_error([&] { muon::distributed::make_optimizer(named, config("sharded"), {}); }, "blocks.0.qkv.weight");
  DistributedLayout stray;
  stray.tensor_parallel.emplace("nope.weight", muon::distributed::TensorParallelShard({4, 4}, 0, Group::single()));
  expect_error([&] { muon::distributed::make_optimizer(named, config("tensor_parallel"), stray); }, "nope.weight");
  // A TP mode without the tensor_parallel layout.
  auto tp = config("none");
  tp.set("muon_tp_mode", "distributed");
  expect_error([&] { muon::distributed::make_optimizer(named, tp, {}); }, "muon_tp_mode");
  // Unknown layout values are rejected by the config itself.
  EXPECT_THROW(config("zero3"), c10::ValueError);
}


// ---- groups laid out by the caller (make_grouped_optimizer) ----------------------

Named whole_model() {
  Named named;
  for (size_t k = 0; k < kModel.size(); ++k) named.insert(kModel[k].first, full_param(k).requires_grad_(true));
  return named;
}

void three_steps(Named& named, torch::optim::Optimizer& opt) {
  for (int64_t s = 0; s < 3; ++s) {
    for (size_t k = 0; k < kModel.size(); ++k) named[kModel[k].first].mutable_grad() = full_grad(k, s);
    opt.step();
  }
}

TEST(DistMakeGrouped, ThePlanBuiltAsGroupsEqualsMakeOptimizer) {
  const auto reference = whole_after(3);
  auto named = whole_model();
  const auto plan = muon::plan_groups(named, config("none"));
  ASSERT_EQ(plan.size(), 3u);  // muon (qkv at lr 0.01), muon, adamw
  EXPECT_EQ(plan[0].optimizer, "muon");
  EXPECT_EQ(plan.back().optimizer, "adamw");
  auto built = muon::distributed::make_grouped_optimizer(plan, config("none"), DistributedLayout());
  EXPECT_EQ(built.group_index, (std::vector<int64_t>{0, 1, 2}));
  three_steps(named, *built.optimizer);
  // The same optimizers on the same groups: bit-identical.
  for (const auto& item : reference) EXPECT_TRUE(at::equal(named[item.key()], item.value())) << item.key();
}

TEST(DistMakeGrouped, EqualGroupsStayApartAndKeepTheirOwnOptions) {
  auto named = whole_model();
  muon::GroupSpec a{"muon", {"blocks.0.fc1.weight"}, {named["blocks.0.fc1.weight"]}, {{"lr", 0.02}}};
  muon::GroupSpec b{"muon", {"blocks.0.fc2.weight"}, {named["blocks.0.fc2.weight"]}, {{"lr", 0.02}}};
  auto built = muon::distributed::make_grouped_optimizer({a, b}, config("none"), DistributedLayout());
  ASSERT_EQ(built.optimizer->param_groups().size(), 2u);  // not merged although equal
  built.optimizer->param_groups()[1].options().set_lr(0.0);
  const auto fc1 = named["blocks.0.fc1.weight"].detach().clone();
  const auto fc2 = named["blocks.0.fc2.weight"].detach().clone();
  for (const auto& n : {"blocks.0.fc1.weight", "blocks.0.fc2.weight"}) named[n].mutable_grad() = at::ones_like(named[n]);
  built.optimizer->step();
  EXPECT_FALSE(at::equal(named["blocks.0.fc1.weight"], fc1));
  EXPECT_TRUE(at::equal(named["blocks.0.fc2.weight"], fc2));  // lr 0 in its own group
}

TEST(DistMakeGrouped, BadSettingsNameTheGroupAndTheKey) {
  auto named = whole_model();
  muon::GroupSpec good{"muon", {"blocks.0.fc1.weight"}, {named["blocks.0.fc1.weight"]}, {}};
  auto typo = good;
  typo.names = {"blocks.0.fc2.weight"};
  typo.params = {named["blocks.0.fc2.weight"]};
  typo.settings = {{"momentun", 0.9}};
  const auto make_good_and_typo = [&] {
    muon::distributed::make_grouped_optimizer({good, typo}, config("none"), DistributedLayout());
  };
  muon::test::expect_value_error(make_good_and_typo, {"param group 1", "did you mean 'momentum'"});
  typo.settings = {{"momentum", 1.5}};
  muon::test::expect_value_error(make_good_and_typo, {"momentum", "1.5"});
  auto twice = good;  // the same tensor in two groups
  twice.names = {"again"};
  EXPECT_THROW(muon::distributed::make_grouped_optimizer({good, twice}, config("none"), DistributedLayout()),
               c10::ValueError);
}

// A c10d process group made outside muon::distributed, as a program (or
// torch.distributed) makes one: Gloo over a shared store.
template <typename Gloo = c10d::ProcessGroupGloo>
c10::intrusive_ptr<c10d::ProcessGroup> outside_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                             int rank, int size) {
  auto options = Gloo::Options::create(muon::test::kThreadRankTimeout);
  options->devices.push_back(Gloo::createDeviceForHostname("127.0.0.1"));
  auto gloo = c10::make_intrusive<Gloo>(store, rank, size, options);
  if constexpr (std::is_base_of_v<c10d::ProcessGroup, Gloo>) {
    return gloo;  // LibTorch 1.x: the Gloo group is the process group
  } else {
    // 2.x: a ProcessGroup holds one backend per device type.
    using PG = std::conditional_t<sizeof(Gloo) != 0, c10d::ProcessGroup, void>;
    auto pg = c10::make_intrusive<PG>(store, rank, size);
    pg->setBackend(c10::DeviceType::CPU, PG::BackendType::GLOO, gloo);
    pg->setDefaultBackend(PG::BackendType::GLOO);
    return pg;
  }
}

TEST(DistMakeGrouped, LayerwiseOverAWrappedProcessGroupEqualsSingleProcess) {
  const auto reference = whole_after(3);
  constexpr int kWorld = 2;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = outside_process_group(c10::make_intrusive<c10d::PrefixStore>("outside", store), r, kWorld);
        auto group = Group::wrap(pg, muon::distributed::GroupOptions().timeout(muon::test::kThreadRankTimeout));
        EXPECT_EQ(group.rank(), r);
        EXPECT_EQ(group.size(), kWorld);
        EXPECT_EQ(group.backend_name(), "gloo");
        auto t = at::full({3}, static_cast<double>(r + 1));
        group.all_reduce_(t);
        EXPECT_TRUE(at::equal(t, at::full({3}, 3.0)));
        EXPECT_THROW(group.split(0), c10::ValueError);  // no store: split where it came from
        auto named = whole_model();
        DistributedLayout layout;
        layout.group = group;
        const auto plan = muon::plan_groups(named, config("layerwise"));
        auto built = muon::distributed::make_grouped_optimizer(plan, config("layerwise"), layout);
        ASSERT_NE(dynamic_cast<muon::distributed::LayerwiseOptimizer*>(built.optimizer.get()), nullptr);
        three_steps(named, *built.optimizer);
        // One owner per parameter runs the same code on the same data; 1e-5
        // covers BLAS summation order only (as the layer-wise tests).
        for (const auto& item : reference) {
          EXPECT_LE(relative(named[item.key()].detach(), item.value().detach(), item.value()), 1e-5)
              << item.key() << " rank " << r;
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST(DistGroupWrap, RejectsANullProcessGroup) {
  EXPECT_THROW(Group::wrap(c10::intrusive_ptr<c10d::ProcessGroup>()), c10::ValueError);
}

}  // namespace
