// muon::plan's arithmetic on cases small enough to compute by hand: the
// bytes each layout sends (Group::bytes_sent's ring model, per call, in
// integers), the state and parameters per rank, the alpha-beta times, the
// compute share of ranks on shared cores, and its bad input. Its agreement
// with real runs (every layout of muon-train-gpt, byte for byte) is tested
// in test_train_gpt_layouts.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "muon/plan.h"
#include "plan_test_util.h"
#include "train_gpt_util.h"

namespace {

using namespace plan_test;  // NOLINT(google-build-using-namespace): round_machine, predict, muon::plan's types
using muon::plan::Route;
using muon::plan::Split;
using muon::plan::Tensor;

Tensor tensor(const std::string& name, std::vector<int64_t> shape, Route route, Split split = Split::kNone) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.route = route;
  t.split = split;
  return t;
}

// One 4×4 Muon matrix and a 4-element AdamW vector: 64 + 16 bytes.
Model tiny() {
  Model m;
  m.name = "tiny";
  m.tensors = {tensor("w", {4, 4}, Route::kMuon), tensor("b", {4}, Route::kAdamW)};
  return m;
}

const muon::plan::Collective* find(const Prediction& p, const std::string& what) {
  for (const auto& c : p.collectives) {
    if (c.what == what) return &c;
  }
  return nullptr;
}

// The step agreement at 2 ranks: 6 slots + one mask word = 7 int64 values,
// all-gathered: (2 − 1) · 56 = 56 bytes.
constexpr int64_t kAgreement2 = 56;

TEST(Plan, ReplicatedAllReducesTheGradientsOnce) {
  const auto p = predict(tiny(), LayoutKind::kReplicated, 2);
  // One bucket of 80 bytes, ring all-reduce: 2 · (2 − 1) · 80 / 2 = 80.
  ASSERT_NE(find(p, "gradients all-reduce"), nullptr);
  EXPECT_EQ(find(p, "gradients all-reduce")->bytes, 80);
  EXPECT_EQ(p.bytes_sent, kAgreement2 + 80);
  // Every rank holds everything: Muon's momentum (64) and AdamW's two
  // moments (2 · 16).
  EXPECT_EQ(p.state_bytes, 64 + 32);
  EXPECT_EQ(p.parameter_bytes, 80);
  EXPECT_EQ(p.gradient_bytes, 80);
}

TEST(Plan, OneRankSendsNothing) {
  for (const auto layout : muon::plan::all_layouts()) {
    const auto p = predict(tiny(), layout, 1);
    if (!p.why_not.empty()) continue;
    SCOPED_TRACE(muon::plan::to_string(layout));
    EXPECT_EQ(p.bytes_sent, 0);
    EXPECT_EQ(p.communication_s, 0);
    EXPECT_EQ(p.state_bytes, 96);
  }
}

TEST(Plan, LayerwiseGathersEachOwnersBucketAtTheLargestSize) {
  const auto p = predict(tiny(), LayoutKind::kLayerwise, 2);
  // Owners by Newton–Schulz cost (4 · 4² = 64 for the matrix, 4 for the
  // vector): the matrix to rank 0, the vector to rank 1. Bucket 0 holds 64
  // bytes on rank 0 and 16 on rank 1 (aligned to 16): gathered at 64,
  // (2 − 1) · 64 bytes from each rank.
  ASSERT_NE(find(p, "updated parameters all-gather"), nullptr);
  EXPECT_EQ(find(p, "updated parameters all-gather")->bytes, 64);
  EXPECT_EQ(p.bytes_sent, kAgreement2 + 80 + 64);
  // The most loaded rank's state: the matrix's momentum, 64 (rank 1: 32).
  EXPECT_EQ(p.state_bytes, 64);
}

TEST(Plan, ShardedSendsRowsToTheirOwnerAndBack) {
  const auto p = predict(tiny(), LayoutKind::kSharded, 2);
  // Rows 2 + 2 of each tensor. Reduce-scatter: each rank sends the 40 bytes
  // of the other's rows. Owner exchange of the matrix (owner rank 0): rank 1
  // sends its 2 rows (32 bytes), rank 0 sends rank 1's 2 rows of the result
  // back (32). All-gather of the updated rows: 40 per rank.
  EXPECT_EQ(find(p, "gradients reduce-scatter")->bytes, 40);
  EXPECT_EQ(find(p, "owner exchange (all-to-all)")->bytes, 32);
  EXPECT_EQ(find(p, "updated rows all-gather")->bytes, 40);
  EXPECT_EQ(p.bytes_sent, kAgreement2 + 40 + 32 + 40);
  EXPECT_EQ(p.bytes_per_rank, (std::vector<int64_t>{168, 168}));
  // Each rank: the state of its rows (momentum 32, AdamW 2 · 8); the whole
  // parameters and its shard of them (80 + 40).
  EXPECT_EQ(p.state_bytes, 48);
  EXPECT_EQ(p.parameter_bytes, 120);
}

TEST(Plan, ShardedReplicatedGathersEveryMatrixEverywhere) {
  const auto p = predict(tiny(), LayoutKind::kShardedReplicated, 2);
  // all_gather_uneven: 9 shape integers (72 bytes), then 2 rows · 16 bytes.
  EXPECT_EQ(find(p, "matrices all-gather (every rank)")->bytes, 72 + 32);
  // Both ranks orthogonalize the whole matrix.
  EXPECT_DOUBLE_EQ(p.newton_schulz_flops, muon::plan::newton_schulz_flops(4, 4, 5));
}

TEST(Plan, TensorParallelGathersTheBlocksAndItsActivations) {
  auto m = tiny();
  m.tensors[0].shape = {4, 2};
  m.tensors[0].split = Split::kRows;
  m.tensors[1].shape = {2};
  m.activation_all_reduces = 3;
  m.activation_elements = 8;
  const auto p = predict(m, LayoutKind::kTensorParallel, 2);
  // Blocks [2, 2]: all_gather_uneven of 4 floats, 72 + 16 bytes. Three
  // all-reduces of 8 floats: 3 · 2 · (2 − 1) · 32 / 2 = 96.
  EXPECT_EQ(find(p, "TP block gather")->bytes, 72 + 16);
  EXPECT_EQ(find(p, "activations all-reduce (TP)")->bytes, 96);
  EXPECT_EQ(p.bytes_sent, kAgreement2 + 88 + 96);
  // The block's momentum (16) and the replicated vector's moments (16).
  EXPECT_EQ(p.state_bytes, 16 + 16);
  // Each rank orthogonalizes the whole matrix (duplicated mode).
  EXPECT_DOUBLE_EQ(p.newton_schulz_flops, muon::plan::newton_schulz_flops(4, 2, 5));
  // An optimizer step alone leaves the activations out.
  Options o;
  o.world = 2;
  o.training_step = false;
  EXPECT_EQ(muon::plan::predict(m, round_machine(), LayoutKind::kTensorParallel, o).bytes_sent, kAgreement2 + 88);
}

TEST(Plan, TwoDimensionalRunsNewtonSchulzTogetherOnTheOwners) {
  Model m;
  m.tensors = {tensor("w", {4, 4}, Route::kMuon, Split::kRows)};
  const auto p = predict(m, LayoutKind::kTensorParallelSharded, 4, 2);
  ASSERT_TRUE(p.why_not.empty()) << p.why_not;
  // World 4 = tp 2 × dp 2. Agreement over the world: (4 − 1) · 7 · 8 = 168.
  // Blocks [2, 4], one row each per dp rank: reduce-scatter 16, owner
  // exchange 16 each way, all-gather 16. The owners (dp rank 0, both TP
  // ranks) all-reduce ‖G‖² (8 bytes) and 5 Gram matrices of 4² floats over
  // TP: 8 + 5 · 64.
  const int64_t owner = 168 + 16 + 16 + (8 + 5 * 64) + 16;
  const int64_t other = 168 + 16 + 16 + 16;
  EXPECT_EQ(p.bytes_per_rank, (std::vector<int64_t>{owner, owner, other, other}));
  EXPECT_EQ(p.bytes_sent, owner);
  // Half the whole matrix's Newton–Schulz on each owner.
  EXPECT_DOUBLE_EQ(p.newton_schulz_flops, muon::plan::newton_schulz_flops(4, 4, 5) / 2);
}

TEST(Plan, BucketsSplitTheGradientAllReduce) {
  // Three 4×4 matrices (64 bytes each) in buckets of 128 bytes: [64, 64],
  // [64]; at 3 ranks each bucket's ring bytes are 2 · 2 · B / 3, rounded
  // down per call: 170 + 85 (the whole, 192 bytes, would give 256).
  Model m;
  for (int k = 0; k < 3; ++k) m.tensors.push_back(tensor("w" + std::to_string(k), {4, 4}, Route::kMuon));
  Options o;
  o.world = 3;
  o.all_reduce_bucket_bytes = 128;
  const auto p = muon::plan::predict(m, round_machine(), LayoutKind::kReplicated, o);
  EXPECT_EQ(find(p, "gradients all-reduce")->bytes, 170 + 85);
}

TEST(Plan, TimesAreFlopsAtTheRateAndAlphaBetaPerCollective) {
  const auto p = predict(tiny(), LayoutKind::kReplicated, 2);
  const double ns = muon::plan::newton_schulz_flops(4, 4, 5);
  EXPECT_DOUBLE_EQ(p.newton_schulz_s, ns / 1e9);
  // Agreement: 1 hop, 56 bytes; all-reduce: 2 hops, 80 bytes; 1 ms a hop,
  // 1 MB/s.
  EXPECT_NEAR(p.communication_s, 3e-3 + 136 / 1e6, 1e-15);
  EXPECT_NEAR(p.step_s, ns / 1e9 + 3e-3 + 136 / 1e6, 1e-15);
  // Beyond a node (ranks_per_node 1): the inter-node link.
  Options o;
  o.world = 2;
  o.ranks_per_node = 1;
  const auto far = muon::plan::predict(tiny(), round_machine(), LayoutKind::kReplicated, o);
  EXPECT_NEAR(far.communication_s, 3e-2 + 136 / 1e5, 1e-15);
  // AdamW's step: no Newton–Schulz; the same traffic.
  EXPECT_NEAR(p.adamw_step_s, 3e-3 + 136 / 1e6, 1e-15);
  EXPECT_NEAR(p.vs_adamw, p.step_s / p.adamw_step_s, 1e-12);
  // A forward and backward of 1e9 FLOPs at 1e9 FLOP/s: 1 s. Muon's cost
  // is its extra step time over AdamW's training step.
  auto m = tiny();
  m.train_flops = 1e9;
  m.train_flops_per_s = 1e9;
  const auto t = predict(m, LayoutKind::kReplicated, 2);
  EXPECT_DOUBLE_EQ(t.train_s, 1.0);
  EXPECT_NEAR(t.throughput_cost, (t.step_s - t.adamw_step_s) / (1.0 + t.adamw_step_s), 1e-15);
  EXPECT_NEAR(t.iteration_ratio, (1.0 + t.step_s) / (1.0 + t.adamw_step_s), 1e-15);
  EXPECT_NEAR(t.share_of_training, t.step_s / (1.0 + t.step_s), 1e-15);
}

TEST(Plan, RowFractionOrthogonalizesThatShareOfTheRows) {
  Options o;
  o.world = 1;
  o.row_fraction = 0.5;
  const auto p = muon::plan::predict(tiny(), round_machine(), LayoutKind::kReplicated, o);
  EXPECT_DOUBLE_EQ(p.newton_schulz_flops, muon::plan::newton_schulz_flops(2, 4, 5));
}

TEST(Plan, RanksOfACpuNodeShareIt) {
  // A CPU node's Newton–Schulz rates are the whole node's, its element-wise
  // rates one thread's: 4 ranks on 2 cores each run Newton–Schulz at a
  // quarter of the node (no rank_gemm_* given) and element-wise work at half
  // a thread; an accelerator's ranks (cores_per_node 0) do not share.
  auto machine = round_machine();
  machine.muon_elementwise_s = 1e-9;
  machine.cores_per_node = 2;
  machine.ranks_per_node = 4;
  Options o;
  o.world = 4;
  const auto p = muon::plan::predict(tiny(), machine, LayoutKind::kReplicated, o);
  EXPECT_DOUBLE_EQ(p.newton_schulz_s, 4 * muon::plan::newton_schulz_flops(4, 4, 5) / 1e9);
  EXPECT_DOUBLE_EQ(p.elementwise_s, 2 * 16 * 1e-9);
  o.world = 1;
  const auto one = muon::plan::predict(tiny(), machine, LayoutKind::kReplicated, o);
  EXPECT_DOUBLE_EQ(one.newton_schulz_s, muon::plan::newton_schulz_flops(4, 4, 5) / 1e9);
  machine.cores_per_node = 0;
  o.world = 4;
  EXPECT_DOUBLE_EQ(muon::plan::predict(tiny(), machine, LayoutKind::kReplicated, o).newton_schulz_s,
                   muon::plan::newton_schulz_flops(4, 4, 5) / 1e9);
}

TEST(Plan, RecommendsTheFastestLayoutThatFits) {
  auto model = Model::gpt(2, 64, 4, 50, 16, 4);
  auto machine = round_machine();
  Options o;
  o.world = 4;
  const auto all = muon::plan::plan(model, machine, o);
  ASSERT_FALSE(all.empty());
  for (size_t k = 1; k < all.size(); ++k) EXPECT_LE(all[k - 1].step_s, all[k].step_s);
  EXPECT_EQ(muon::plan::recommend(model, machine, o).layout, all.front().layout);
  // Memory for the sharded layouts only: they come first, whatever their time.
  const auto sharded = muon::plan::predict(model, machine, LayoutKind::kSharded, o);
  machine.memory_bytes = static_cast<double>(sharded.parameter_bytes + sharded.gradient_bytes + sharded.state_bytes);
  const auto fitting = muon::plan::plan(model, machine, o);
  EXPECT_TRUE(fitting.front().fits);
  for (const auto& p : fitting) {
    if (p.layout == LayoutKind::kReplicated) {
      EXPECT_FALSE(p.fits);
    }
  }
}

TEST(Plan, GptIsTheMainJobsModel) {
  const auto m = Model::gpt(4, 128, 4, 46, 64, 32);
  // muon-train-gpt reports 810112 parameters for these flags.
  EXPECT_EQ(m.parameters(), 810112);
  EXPECT_EQ(m.muon_parameters(), 4 * (3 + 1 + 4 + 4) * 128 * 128);
  EXPECT_EQ(m.activation_all_reduces, 16);
  EXPECT_EQ(m.activation_elements, 32 * 64 * 128);
}

TEST(Plan, PresetsAndFilesRoundTrip) {
  for (const auto& name : Model::preset_names()) {
    const auto m = Model::preset(name);
    EXPECT_GT(m.muon_parameters(), 0) << name;
  }
  const auto m = Model::from_json(
      R"({"name": "x", "tensors": [{"name": "w", "shape": [8, 4], "count": 3},
                                    {"name": "n", "shape": [4]}]})");
  ASSERT_EQ(m.tensors.size(), 4U);
  EXPECT_EQ(m.tensors[0].route, Route::kMuon);
  EXPECT_EQ(m.tensors[3].route, Route::kAdamW);
  const auto h100 = Machine::preset("h100");
  const auto back = Machine::from_json(h100.to_json());
  EXPECT_EQ(back.to_json(), h100.to_json());
}

TEST(Plan, BadInputIsNamed) {
  EXPECT_NE(error_of([] { Model::preset("gpt-9000"); }).find("no model preset 'gpt-9000'"), std::string::npos);
  EXPECT_NE(error_of([] { Machine::preset("tpu"); }).find("no machine preset 'tpu'"), std::string::npos);
  EXPECT_NE(error_of([] { Model::from_json("{"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { Model::from_json(R"({"tensors": [{"shape": [0, 3]}]})"); }).find("shape"),
            std::string::npos);
  EXPECT_NE(error_of([] { Model::from_json(R"({"tensors": [{"shape": [3], "route": "sgd"}]})"); })
                .find("'sgd'"),
            std::string::npos);
  EXPECT_NE(error_of([] { Machine::from_json(R"({"gemm_fp32": [1, 2]})"); }).find("gemm_fp32"), std::string::npos);
  EXPECT_NE(error_of([] { muon::plan::parse_layout("zero3"); }).find("no layout 'zero3'"), std::string::npos);
  EXPECT_NE(error_of([] { Model::gpt(1, 30, 4, 10, 8, 1); }).find("heads must divide width"), std::string::npos);
  // A layout that cannot run says why instead of predicting.
  EXPECT_FALSE(predict(tiny(), LayoutKind::kTensorParallelSharded, 3, 2).why_not.empty());
  EXPECT_FALSE(predict(tiny(), LayoutKind::kTensorParallelSharded, 2, 2).why_not.empty());
}

// ---- the muon-plan command ----

train_gpt_test::Output run_plan(const std::string& args) {
  return train_gpt_test::run_program_command(std::string(MUON_PLAN_BIN) + " " + args);
}

TEST(PlanCommand, PrintsEveryLayoutAndRecommendsOne) {
  const auto r = run_plan("--model kimi-k2 --machine gb300 --world 64 --ns-dtype bf16 --optimizer-step");
  ASSERT_EQ(r.status, 0) << r.text;
  for (const char* layout : {"replicated", "layerwise", "sharded", "sharded-replicated"}) {
    EXPECT_NE(r.text.find(std::string("\n") + layout + " "), std::string::npos) << layout << "\n" << r.text;
  }
  EXPECT_NE(r.text.find("recommended: "), std::string::npos) << r.text;
}

TEST(PlanCommand, BadFlagsAreOneLineNamingThem) {
  for (const auto& [args, named] : std::vector<std::pair<std::string, std::string>>{
           {"--world 2", "--machine"},
           {"--machine h100 --world 0", "--world"},
           {"--machine h100 --model nonesuch", "nonesuch"},
           {"--machine h100 --layout zero3", "zero3"},
           {"--machine /nonexistent.json", "/nonexistent.json"}}) {
    const auto r = run_plan(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.text;
    EXPECT_NE(r.text.find(named), std::string::npos) << args << "\n" << r.text;
    EXPECT_EQ(std::count(r.text.begin(), r.text.end(), '\n'), 1) << args << "\n" << r.text;
  }
}

TEST(PlanCommand, CalibrateWritesAMachineThePlanReads) {
  const auto dir = std::filesystem::temp_directory_path() / ("muon_plan_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const auto file = (dir / "this.json").string();
  const auto cal = run_plan("calibrate --out " + file);
  ASSERT_EQ(cal.status, 0) << cal.text;
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const auto machine = Machine::from_json(text.str());
  for (int c = 0; c < muon::plan::kShapeClasses; ++c) {
    EXPECT_GT(machine.gemm_fp32[c], 1e8);  // any x86-64 core does more than 0.1 GFLOP/s
    EXPECT_GT(machine.rank_gemm_fp32[c], 1e8);
  }
  EXPECT_GT(machine.muon_elementwise_s, 0);
  EXPECT_GT(machine.intra.bytes_per_s, 1e6);
  EXPECT_GE(machine.cores_per_node, 1);
  // The command's JSON is the library's prediction for the main job's model.
  const auto r = run_plan("--machine " + file + " --world 2 --layout sharded --json");
  ASSERT_EQ(r.status, 0) << r.text;
  const auto j = nlohmann::json::parse(r.text);
  Options o;
  o.world = 2;
  const auto p = muon::plan::predict(Model::gpt(4, 128, 4, 46, 64, 32), machine, LayoutKind::kSharded, o);
  EXPECT_EQ(j.at(0).at("bytes_sent").get<int64_t>(), p.bytes_sent);
  EXPECT_EQ(j.at(0).at("state_bytes").get<int64_t>(), p.state_bytes);
  std::filesystem::remove_all(dir);
}

}  // namespace
