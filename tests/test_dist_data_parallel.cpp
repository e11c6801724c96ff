// Sharded data parallelism (ZeRO-2): equals one process stepping the whole
// tensors with the averaged gradient (hybrid Muon/AdamW and AdamW, 2 and 3
// ranks, uneven and empty shards, many buckets); optimizer state split over
// the ranks; the 2-D layout (tensor parallel inside); checkpoints saved at 2
// ranks and loaded at 3; errors raised together on every rank with the
// parameters unchanged. Ranks are threads over real Gloo groups.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dist_util.h"
#include "expect_util.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/distributed/layouts/sharded_data_parallel.h"
#include "muon/optim/state_bytes.h"
#include "muon/registry.h"

namespace {

using muon::OptimizerConfig;
using muon::distributed::Group;
using muon::distributed::ShardedDataParallel;
using muon::distributed::ShardedDataParallelOptions;
using muon::test::ParamSpec;
using muon::test::seeded_randn;
using Named = torch::OrderedDict<std::string, at::Tensor>;


// Two Muon matrices with rows that do not divide 2 or 3, a 2-row matrix
// (an empty shard at 3 ranks), a bias and a 1-row gain (AdamW by the 1-D
// rule; empty shards at 2 and 3 ranks) and an embedding (AdamW by the
// embedding rule).
const std::vector<ParamSpec> kModel{{"blocks.0.fc.weight", {7, 5}},  {"blocks.0.proj.weight", {6, 7}},
                               {"blocks.0.fc.bias", {5}},       {"embed.weight", {11, 5}},
                               {"blocks.0.gate.weight", {2, 5}}, {"blocks.0.gain", {1}}};

// The parameter no rank has a gradient for at step 1 (skipped by everyone).
constexpr size_t kSkippedParam = 1;
constexpr int64_t kSkippedStep = 1;

Named make_params(const std::vector<ParamSpec>& specs, uint64_t seed = 10) {
  return muon::test::seeded_params(specs, seed);
}

// Rank `rank`'s own gradient of parameter k at `step`: different on every rank.
at::Tensor rank_grad(const ParamSpec& spec, size_t k, int64_t step, int64_t rank) {
  return seeded_randn(spec.shape, 1000 + 101 * static_cast<uint64_t>(step) + 17 * static_cast<uint64_t>(rank) + k);
}

// The mean of the ranks' gradients as one process would take it: at::mean
// over the stacked copies (a reduction order of its own, not the library's).
at::Tensor mean_grad(const ParamSpec& spec, size_t k, int64_t step, int world) {
  std::vector<at::Tensor> grads;
  for (int r = 0; r < world; ++r) grads.push_back(rank_grad(spec, k, step, r));
  return at::stack(grads).mean(0);
}

OptimizerConfig muon_config() {
  return OptimizerConfig().set("optimizer", "muon").set("lr", 0.02).set("weight_decay", 0.1);
}
OptimizerConfig adamw_config() {
  return OptimizerConfig().set("optimizer", "adamw").set("lr", 0.02).set("weight_decay", 0.1);
}
// Muon and AdamW are invariant to the gradient's scale (a sum instead of the
// mean goes unseen); SGD's update is proportional to it.
OptimizerConfig sgd_config() {
  return OptimizerConfig().set("optimizer", "sgd").set("lr", 0.02).set("weight_decay", 0.1);
}
OptimizerConfig config_named(const std::string& name) {
  if (name == "muon") return muon_config();
  if (name == "adamw") return adamw_config();
  return sgd_config();
}

// Steps `from` to `to` of one process over the whole tensors: the gradient
// averaged over `world` ranks, none for kSkippedParam at kSkippedStep.
void reference_steps(Named& named, torch::optim::Optimizer& opt, const std::vector<ParamSpec>& specs,
                     int64_t from, int64_t to, int world) {
  for (int64_t s = from; s < to; ++s) {
    for (size_t k = 0; k < specs.size(); ++k) {
      named[specs[k].name].mutable_grad() =
          (k == kSkippedParam && s == kSkippedStep) ? at::Tensor() : mean_grad(specs[k], k, s, world);
    }
    opt.step();
  }
}

Named reference(const OptimizerConfig& config, int64_t steps, int world) {
  auto named = make_params(kModel);
  auto opt = muon::make_optimizer(named, config);
  reference_steps(named, *opt, kModel, 0, steps, world);
  return named;
}

void distributed_steps(ShardedDataParallel& dp, const std::vector<ParamSpec>& specs, int64_t from,
                       int64_t to, int rank) {
  for (int64_t s = from; s < to; ++s) {
    dp.zero_grad();
    for (size_t k = 0; k < specs.size(); ++k) {
      if (k == kSkippedParam && s == kSkippedStep) continue;
      dp.parameters()[specs[k].name].mutable_grad() = rank_grad(specs[k], k, s, rank);
    }
    dp.step();
  }
}

// Why the tolerances hold on any CPU. The library averages the W gradients
// in rank order in fp32, the reference with at::mean: each averaged element
// differs by at most W·2⁻²⁴ relative; every other operation is the same
// formula on the same element, so only rounding separates the two.
//
// Element-wise optimizers (SGD, AdamW): an update changes relatively by at
// most 2·W·2⁻²⁴ (AdamW's m̂/(√v̂+ε) twice the gradient's change, SGD's
// momentum once), plus a rounding or two of its own: 4·W·2⁻²⁴ bounds it.
// The updates are at most lr·50 (SGD's momentum sums |g|/(1 − 0.9) with
// |g| ≤ 5 for these normal draws; AdamW's m̂/√v̂ ≤ 3.2), and writing the
// parameter (|p| ≤ 8) rounds twice, so a step adds at most
// 2⁻²⁴·(4·W·lr·50 + 2·8) ≈ 1.7e-6 at W = 3.
double elementwise_tolerance(int64_t steps, int world) {
  const double lr = 0.02;
  return static_cast<double>(steps) * std::ldexp(1.0, -24) * (4.0 * world * lr * 50.0 + 2.0 * 8.0);
}

// Muon orthogonalizes the momentum with five fp32 Newton–Schulz iterations
// of a quintic whose slope is at most a ≤ 4.1 (the largest linear
// coefficient of the schedule), so a perturbation grows at most
// 4.1⁵ ≈ 1.2e3 times; each iteration's own fp32 rounding (matrix products of
// length ≤ 11, in whatever summation order the BLAS picks) adds a few units
// of 2⁻²⁴ relative before being amplified: 16 units bound both. The
// orthogonalized matrix has singular values ≤ 1.2, so entries ≤ 1.2, times
// the spectral scale √max(rows, cols) ≤ √10 for these shapes. A parameter
// thus moves by at most lr · 1.2e3 · 16 · 2⁻²⁴ · 1.2·√10 ≈ 8.4e-5 away from
// the reference per step (weight decay only shrinks an earlier difference by
// 1 − lr·wd); the AdamW half of the hybrid stays within the bound above.
//
// What the tolerances catch: one rank's gradient instead of the mean, or
// rows shifted, moves parameters by ~lr = 2e-2 per step. Muon and AdamW do
// not see the gradient's scale, so a sum instead of the mean (or a mean off
// by 0.1%) is caught by the SGD cases: lr·|g|·0.1% ≈ 1e-4 ≫ 1.7e-6.
double muon_tolerance(int64_t steps) {
  const double lr = 0.02;
  const double amplification = std::pow(4.1, 5);
  const double roundings = 16;
  const double max_entry = 1.2 * std::sqrt(10.0);
  return static_cast<double>(steps) * lr * amplification * roundings * std::ldexp(1.0, -24) * max_entry;
}

// max |got − expected| over the parameters, with the name of the worst.
std::pair<double, std::string> max_difference(const Named& got, const Named& expected) {
  std::pair<double, std::string> worst{0.0, ""};
  for (const auto& item : expected) {
    const auto d = (got[item.key()].detach() - item.value().detach()).abs().max().item<double>();
    if (d > worst.first || worst.second.empty()) worst = {d, item.key()};
  }
  return worst;
}

// Every rank's full parameters are the same bytes (they come from one gather).
void expect_replicas_identical(const Named& named, const Group& group) {
  for (const auto& item : named) {
    const auto all = group.all_gather(item.value().detach().contiguous());
    for (size_t r = 1; r < all.size(); ++r) {
      EXPECT_TRUE(at::equal(all[r], all[0])) << item.key() << " differs between rank " << r << " and 0";
    }
  }
}

struct EqualityCase {
  std::string config;
  int world;
  int64_t bucket_bytes;
};

void PrintTo(const EqualityCase& c, std::ostream* os) {
  *os << c.config << " at " << c.world << " ranks, bucket_bytes " << c.bucket_bytes;
}

class DataParallelEquality : public ::testing::TestWithParam<EqualityCase> {};

TEST_P(DataParallelEquality, EqualsOneProcessWithTheAveragedGradient) {
  const auto& param = GetParam();
  const auto config = config_named(param.config);
  constexpr int64_t kSteps = 4;
  const auto expected = reference(config, kSteps, param.world);
  muon::test::run_ranks(param.world, [&](Group& group) {
    auto named = make_params(kModel);
    ShardedDataParallel dp(named, config, group, {},
                           ShardedDataParallelOptions().bucket_bytes(param.bucket_bytes));
    distributed_steps(dp, kModel, 0, kSteps, group.rank());
    const auto [diff, name] = max_difference(named, expected);
    const auto tolerance = param.config == "muon" ? muon_tolerance(kSteps)
                                                  : elementwise_tolerance(kSteps, param.world);
    EXPECT_LE(diff, tolerance) << name << " on rank " << group.rank();
    if (group.rank() == 0) std::cout << "[ measured ] max |difference| " << diff << " (" << name << ")\n";
    // The master shards are this rank's rows of the full parameters.
    for (const auto& item : named) {
      const auto& rows = dp.rows_per_rank(item.key());
      const auto mine = rows[static_cast<size_t>(group.rank())];
      EXPECT_TRUE(at::equal(dp.shards()[item.key()],
                            item.value().detach().narrow(0, dp.row_offset(item.key()), mine)))
          << item.key();
    }
    expect_replicas_identical(named, group);
  });
}

INSTANTIATE_TEST_SUITE_P(
    ConfigsWorldsBuckets, DataParallelEquality,
    ::testing::Values(EqualityCase{"muon", 2, muon::distributed::kDefaultDataParallelBucketBytes},
                      EqualityCase{"muon", 3, muon::distributed::kDefaultDataParallelBucketBytes},
                      EqualityCase{"muon", 3, 64},  // a bucket per parameter: overlap path
                      EqualityCase{"adamw", 2, muon::distributed::kDefaultDataParallelBucketBytes},
                      EqualityCase{"adamw", 3, 100},
                      EqualityCase{"sgd", 2, muon::distributed::kDefaultDataParallelBucketBytes},
                      EqualityCase{"sgd", 3, 100}),
    [](const auto& info) {
      return info.param.config + "_" + std::to_string(info.param.world) + "ranks_" +
             std::to_string(info.param.bucket_bytes) + "B";
    });

TEST(DataParallel, SplitsRowsAsBalancedSplitSizes) {
  muon::test::run_ranks(3, [](Group& group) {
    auto named = make_params(kModel);
    ShardedDataParallel dp(named, muon_config(), group);
    EXPECT_EQ(dp.rows_per_rank("blocks.0.fc.weight"), (std::vector<int64_t>{3, 2, 2}));
    EXPECT_EQ(dp.rows_per_rank("blocks.0.gate.weight"), (std::vector<int64_t>{1, 1, 0}));
    EXPECT_EQ(dp.rows_per_rank("blocks.0.gain"), (std::vector<int64_t>{1, 0, 0}));
    EXPECT_EQ(dp.layout().row_shards.size(), kModel.size());
    EXPECT_EQ(dp.layout().group.size(), 3);
    int64_t shard_bytes = 0;
    int64_t full_bytes = 0;
    for (const auto& item : named) full_bytes += static_cast<int64_t>(item.value().nbytes());
    for (const auto& item : dp.shards()) shard_bytes += static_cast<int64_t>(item.value().nbytes());
    EXPECT_EQ(dp.parameter_bytes(), full_bytes + shard_bytes);
    EXPECT_EQ(dp.bucket_count(), 1U);  // one dtype, far below 4 MiB
  });
}

// ---- optimizer state: about total / W per rank ------------------------------------

TEST(DataParallel, OptimizerStateIsSplitOverTheRanks) {
  // Every dim 0 divides 2 and 4: each rank holds exactly 1/W of the rows.
  const std::vector<ParamSpec> model{{"blocks.0.fc.weight", {16, 12}}, {"blocks.0.proj.weight", {12, 16}},
                                {"blocks.0.fc.bias", {16}},       {"embed.weight", {32, 12}}};
  auto whole = make_params(model);
  auto single = muon::make_optimizer(whole, muon_config());
  for (auto& item : whole) item.value().mutable_grad() = at::ones_like(item.value());
  single->step();
  const auto total = muon::optimizer_state_bytes(*single);
  ASSERT_GT(total, 0);
  for (const int world : {2, 4}) {
    std::mutex mu;
    int64_t sum = 0;
    muon::test::run_ranks(world, [&](Group& group) {
      auto named = make_params(model);
      ShardedDataParallel dp(named, muon_config(), group);
      for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
      dp.step();
      const auto mine = dp.state_bytes();
      EXPECT_EQ(mine, muon::optimizer_state_bytes(dp.optimizer()));
      const double ratio = static_cast<double>(mine) / (static_cast<double>(total) / world);
      EXPECT_NEAR(ratio, 1.0, 0.1) << "rank " << group.rank() << " of " << world << ": " << mine
                                   << " bytes of " << total;
      // State only for this rank's rows: the same as one process holding
      // just these shards.
      Named copies;
      for (const auto& item : dp.shards()) {
        copies.insert(item.key(), item.value().detach().clone().requires_grad_(true));
        copies[item.key()].mutable_grad() = at::ones_like(item.value());
      }
      auto local = muon::make_optimizer(copies, muon_config());
      local->step();
      EXPECT_EQ(mine, muon::optimizer_state_bytes(*local)) << "rank " << group.rank();
      std::lock_guard<std::mutex> lock(mu);
      sum += mine;
      std::cout << "[ state    ] " << world << " ranks, rank " << group.rank() << ": " << mine
                << " of " << total << " bytes (ratio to total/W " << ratio << ")\n";
    });
    // Equal up to per-parameter scalars (step counters) each rank keeps.
    EXPECT_NEAR(static_cast<double>(sum), static_cast<double>(total), 0.01 * static_cast<double>(total)) << world << " ranks";
  }
}

// ---- 2-D: tensor parallel inside, sharded data parallel outside ------------------

TEST(DataParallel, TwoDimensionalEqualsOneProcessOnWholeMatrices) {
  // fc1 is column-parallel (dim 0 split over TP), fc2 row-parallel (dim 1);
  // the bias is replicated over TP. Block rows are then split over dp,
  // unevenly (5 → 3 + 2, 7 → 4 + 3).
  const std::vector<ParamSpec> whole_model{{"blocks.0.fc1.weight", {10, 6}},
                                      {"blocks.0.fc2.weight", {7, 9}},
                                      {"blocks.0.fc2.bias", {7}}};
  const std::map<std::string, int64_t> partition{{"blocks.0.fc1.weight", 0}, {"blocks.0.fc2.weight", 1}};
  constexpr int kDp = 2;
  constexpr int kTp = 2;
  constexpr int64_t kSteps = 3;
  auto whole = make_params(whole_model);
  {
    auto opt = muon::make_optimizer(whole, muon_config());
    for (int64_t s = 0; s < kSteps; ++s) {
      for (size_t k = 0; k < whole_model.size(); ++k) {
        whole[whole_model[k].name].mutable_grad() = mean_grad(whole_model[k], k, s, kDp);
      }
      opt->step();
    }
  }
  auto block = [&](const at::Tensor& t, const std::string& name, int tp_rank) {
    const auto it = partition.find(name);
    if (it == partition.end()) return t;
    const auto sizes = muon::distributed::balanced_split_sizes(t.size(it->second), kTp);
    return t.narrow(it->second, muon::distributed::split_offset(sizes, tp_rank), sizes[static_cast<size_t>(tp_rank)]);
  };
  muon::test::run_ranks(kDp * kTp, [&](Group& world) {
    auto [dp_group, tp_group] = world.mesh(kDp, kTp);
    const int d = dp_group.rank();
    const int t = tp_group.rank();
    Named named;
    std::map<std::string, muon::distributed::TensorParallelShard> tp;
    auto initial = make_params(whole_model);
    for (const auto& spec : whole_model) {
      named.insert(spec.name, block(initial[spec.name].detach(), spec.name, t).clone().requires_grad_(true));
      const auto it = partition.find(spec.name);
      if (it != partition.end()) tp.emplace(spec.name, muon::distributed::TensorParallelShard(spec.shape, it->second, tp_group));
    }
    ShardedDataParallel dp(named, muon_config(), dp_group, tp);
    EXPECT_EQ(dp.layout().row_shards.at("blocks.0.fc1.weight").global_shape(), (std::vector<int64_t>{5, 6}));
    EXPECT_TRUE(dp.layout().row_shards.at("blocks.0.fc2.weight").has_tensor_parallel());
    for (int64_t s = 0; s < kSteps; ++s) {
      dp.zero_grad();
      for (size_t k = 0; k < whole_model.size(); ++k) {
        const auto& spec = whole_model[k];
        named[spec.name].mutable_grad() = block(rank_grad(spec, k, s, d), spec.name, t).contiguous();
      }
      dp.step();
    }
    double worst = 0;
    for (const auto& spec : whole_model) {
      const auto expected = block(whole[spec.name].detach(), spec.name, t);
      const auto diff = (named[spec.name].detach() - expected).abs().max().item<double>();
      EXPECT_LE(diff, muon_tolerance(kSteps)) << spec.name << " on dp " << d << ", tp " << t;
      worst = std::max(worst, diff);
    }
    std::cout << "[ measured ] dp " << d << ", tp " << t << ": max |difference| " << worst << "\n";
  });
}

// ---- checkpoints: saved at 2 ranks, loaded at 3 ----------------------------------

TEST(DataParallel, CheckpointSavedAtTwoRanksLoadsAtThree) {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / ("muon_sdp_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto config = muon_config();
  constexpr int64_t kSaved = 3;  // steps at 2 ranks before saving
  constexpr int64_t kLater = 2;  // steps at 3 ranks after loading
  // One process: 3 steps with the mean of 2 ranks' gradients, then 2 with 3 ranks'.
  auto expected_at_save = make_params(kModel);
  auto expected = make_params(kModel);
  {
    auto opt = muon::make_optimizer(expected, config);
    reference_steps(expected, *opt, kModel, 0, kSaved, 2);
    for (const auto& item : expected) expected_at_save[item.key()].detach().copy_(item.value().detach());
    reference_steps(expected, *opt, kModel, kSaved, kSaved + kLater, 3);
  }
  const auto options = muon::distributed::CheckpointOptions().fsync(false);
  Named saved;  // the full parameters of the 2-rank run when it saved
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(kModel);
    ShardedDataParallel dp(named, config, group);
    distributed_steps(dp, kModel, 0, kSaved, group.rank());
    if (group.rank() == 0) {
      for (const auto& item : named) saved.insert(item.key(), item.value().detach().clone());
    }
    muon::distributed::save_checkpoint(dir.string(), dp.shards(), dp.optimizer(), kSaved, dp.layout(), "", options);
  });
  muon::test::run_ranks(3, [&](Group& group) {
    auto named = make_params(kModel, /*seed=*/777);  // other values: all must come from the checkpoint
    ShardedDataParallel dp(named, config, group);
    const auto info = muon::distributed::load_checkpoint(dir.string(), dp.shards(), dp.optimizer(), dp.layout(), options);
    EXPECT_EQ(info.step, kSaved);
    EXPECT_EQ(info.world_size, 2);
    dp.gather_parameters();
    // What the 2 ranks saved, bit for bit; and that run was one process's.
    for (const auto& item : saved) EXPECT_TRUE(at::equal(named[item.key()].detach(), item.value())) << item.key();
    EXPECT_LE(max_difference(named, expected_at_save).first, muon_tolerance(kSaved));
    distributed_steps(dp, kModel, kSaved, kSaved + kLater, group.rank());
    const auto [diff, name] = max_difference(named, expected);
    EXPECT_LE(diff, muon_tolerance(kSaved + kLater)) << name << " on rank " << group.rank();
    if (group.rank() == 0) std::cout << "[ measured ] after loading at 3 ranks: max |difference| " << diff << "\n";
  });
  fs::remove_all(dir);
}

// ---- errors: the same on every rank, nothing changed, no hang --------------------

// The messages every rank caught (empty: none), by rank.
struct Caught {
  std::mutex mu;
  std::vector<std::string> messages;
  explicit Caught(int world) : messages(static_cast<size_t>(world)) {}
  void set(int rank, const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    messages[static_cast<size_t>(rank)] = m;
  }
};

// Steps `dp`, which must raise c10::ValueError: its message goes to `caught`.
void step_expecting_error(ShardedDataParallel& dp, Caught& caught) {
  const int rank = dp.group().rank();
  try {
    dp.step();
    ADD_FAILURE() << "no error on rank " << rank;
  } catch (const c10::ValueError& e) {
    caught.set(rank, e.what_without_backtrace());
  }
}

std::vector<at::Tensor> snapshot(const Named& named) {
  std::vector<at::Tensor> out;
  for (const auto& item : named) out.push_back(item.value().detach().clone());
  return out;
}

void expect_unchanged(const Named& named, const std::vector<at::Tensor>& before) {
  for (size_t k = 0; k < before.size(); ++k) {
    EXPECT_TRUE(at::equal(named[k].value().detach(), before[k])) << named[k].key() << " changed";
  }
}

void expect_same_error_everywhere(const Caught& caught, const std::vector<std::string>& parts) {
  ASSERT_FALSE(caught.messages.empty());
  for (size_t r = 0; r < caught.messages.size(); ++r) {
    EXPECT_EQ(caught.messages[r], caught.messages[0]) << "rank " << r;
  }
  EXPECT_EQ(caught.messages[0].rfind("[muon::distributed::ShardedDataParallel] ", 0), 0U) << caught.messages[0];
  EXPECT_LT(caught.messages[0].size(), 400U) << caught.messages[0];
  for (const auto& p : parts) EXPECT_NE(caught.messages[0].find(p), std::string::npos) << caught.messages[0];
}

TEST(DataParallel, GradientMissingOnOneRankRaisesOnEveryRank) {
  Caught caught(3);
  muon::test::run_ranks(3, [&](Group& group) {
    auto named = make_params(kModel);
    ShardedDataParallel dp(named, muon_config(), group);
    const auto before = snapshot(named);
    for (size_t k = 0; k < kModel.size(); ++k) {
      if (k == 3 && group.rank() == 1) continue;  // embed.weight: no gradient on rank 1
      named[kModel[k].name].mutable_grad() = rank_grad(kModel[k], k, 0, group.rank());
    }
    step_expecting_error(dp, caught);
    expect_unchanged(named, before);
    // The group is still usable: a consistent step goes through.
    named[kModel[3].name].mutable_grad() = rank_grad(kModel[3], 3, 0, group.rank());
    dp.step();
    EXPECT_FALSE(at::equal(named[0].value().detach(), before[0]));
  });
  expect_same_error_everywhere(caught, {"'embed.weight'", "ranks [0, 2]", "ranks [1]"});
}

TEST(DataParallel, NonFiniteGradientOnOneRankRaisesOnEveryRankAndChangesNothing) {
  for (const auto& config : {muon_config(), adamw_config()}) {
    Caught caught(2);
    muon::test::run_ranks(2, [&](Group& group) {
      auto named = make_params(kModel);
      ShardedDataParallel dp(named, config, group);
      const auto before = snapshot(named);
      for (size_t k = 0; k < kModel.size(); ++k) {
        named[kModel[k].name].mutable_grad() = rank_grad(kModel[k], k, 0, group.rank());
      }
      // The last row of fc.weight: held by rank 1, poisoned by rank 0. The
      // step's agreement sees it before the reduction and names the rank
      // whose gradient it is.
      if (group.rank() == 0) named[0].value().mutable_grad()[6][0] = std::numeric_limits<float>::quiet_NaN();
      step_expecting_error(dp, caught);
      expect_unchanged(named, before);
      for (size_t k = 0; k < kModel.size(); ++k) {
        EXPECT_TRUE(at::equal(dp.shards()[k].value(), before[k].narrow(0, dp.row_offset(kModel[k].name),
                                                                       dp.shards()[k].value().size(0))));
      }
    });
    expect_same_error_everywhere(caught, {"'blocks.0.fc.weight'", "non-finite", "on rank 0"});
  }
}

TEST(DataParallel, SkipStepPolicySkipsOnEveryRank) {
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(kModel);
    ShardedDataParallel dp(named, muon_config().set("nonfinite", "skip_step"), group);
    const auto before = snapshot(named);
    for (size_t k = 0; k < kModel.size(); ++k) {
      named[kModel[k].name].mutable_grad() = rank_grad(kModel[k], k, 0, group.rank());
    }
    if (group.rank() == 1) named[3].value().mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    dp.step();
    EXPECT_EQ(dp.skipped_steps(), 1);
    expect_unchanged(named, before);
  });
}

TEST(DataParallel, GradientOfAnotherShapeRaisesOnEveryRank) {
  Caught caught(2);
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(kModel);
    ShardedDataParallel dp(named, muon_config(), group);
    for (size_t k = 0; k < kModel.size(); ++k) {
      named[kModel[k].name].mutable_grad() = rank_grad(kModel[k], k, 0, group.rank());
    }
    const auto before = snapshot(named);
    if (group.rank() == 1) named[1].value().mutable_grad() = at::zeros({6, 8});
    step_expecting_error(dp, caught);
    expect_unchanged(named, before);
  });
  expect_same_error_everywhere(caught, {"'blocks.0.proj.weight'", "rank 1", "shape"});
}

TEST(DataParallel, BadArgumentsRaiseNamingThem) {
  auto named = make_params(kModel);
  const auto single = Group::single();
  auto message = muon::test::error_of([&] {
    ShardedDataParallel dp(named, muon_config(), single, {}, ShardedDataParallelOptions().bucket_bytes(0));
  });
  EXPECT_NE(message.find("bucket_bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("got 0"), std::string::npos) << message;
  EXPECT_EQ(message.rfind("[muon::distributed::ShardedDataParallel] ", 0), 0U) << message;

  Named scalar;
  scalar.insert("temperature", at::ones({}).requires_grad_(true));
  message = muon::test::error_of([&] { ShardedDataParallel dp(scalar, muon_config(), single); });
  EXPECT_NE(message.find("'temperature'"), std::string::npos) << message;
  EXPECT_NE(message.find("0-d"), std::string::npos) << message;

  message = muon::test::error_of([&] { ShardedDataParallel dp(named, muon_config(), Group()); });
  EXPECT_NE(message.find("dp is invalid"), std::string::npos) << message;

  message = muon::test::error_of([&] {
    ShardedDataParallel dp(named, muon_config().set("layout", "layerwise"), single);
  });
  EXPECT_NE(message.find("'layerwise'"), std::string::npos) << message;

  std::map<std::string, muon::distributed::TensorParallelShard> tp{
      {"no.such.weight", muon::distributed::TensorParallelShard({4, 4}, 0, single)}};
  message = muon::test::error_of([&] { ShardedDataParallel dp(named, muon_config(), single, tp); });
  EXPECT_NE(message.find("'no.such.weight'"), std::string::npos) << message;

  ShardedDataParallel dp(named, muon_config(), single);
  message = muon::test::error_of([&] { dp.rows_per_rank("missing.weight"); });
  EXPECT_NE(message.find("'missing.weight'"), std::string::npos) << message;
}

TEST(DataParallel, ReplicasThatStartDifferentRaise) {
  Caught caught(2);
  muon::test::run_ranks(2, [&](Group& group) {
    auto named = make_params(kModel, group.rank() == 0 ? 10 : 11);
    try {
      ShardedDataParallel dp(named, muon_config(), group);
      ADD_FAILURE() << "no error on rank " << group.rank();
    } catch (const c10::ValueError& e) {
      caught.set(group.rank(), e.what_without_backtrace());
    }
  });
  EXPECT_NE(caught.messages[0].find("broadcast"), std::string::npos) << caught.messages[0];
  EXPECT_EQ(caught.messages[0], caught.messages[1]);
}

TEST(DataParallel, ZeroGradClearsFullAndShardGradients) {
  auto named = make_params(kModel);
  ShardedDataParallel dp(named, muon_config(), Group::single());
  for (auto& item : named) item.value().mutable_grad() = at::ones_like(item.value());
  dp.step();
  for (const auto& item : dp.shards()) EXPECT_TRUE(item.value().grad().defined()) << item.key();
  dp.zero_grad();
  for (const auto& item : named) EXPECT_FALSE(item.value().grad().defined()) << item.key();
  for (const auto& item : dp.shards()) EXPECT_FALSE(item.value().grad().defined()) << item.key();
}

}  // namespace
