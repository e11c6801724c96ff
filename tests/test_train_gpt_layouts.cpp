// Every layout of muon-train-gpt (--parallel single | ddp | sharded | tp |
// tp,sharded, with and without experts) trains the small GPT to the
// single-process curve, with the memory per rank each layout promises: the
// model in-process over thread ranks, the program as a user runs it (real
// processes through muon-launch).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dist_util.h"
#include "gpt.h"
#include "muon/distributed/layouts/qk_clip.h"
#include "muon/plan.h"
#include "report.h"
#include "train_gpt_curve_util.h"
#include "train_gpt_util.h"

namespace {

namespace fs = std::filesystem;
using train_gpt_test::largest_difference;
using train_gpt_test::Output;
using train_gpt_test::run_program;
using train_gpt_test::scratch;

// ---- the model over thread ranks ----

train_gpt::GptConfig small_model(int64_t heads, int64_t experts) {
  train_gpt::GptConfig c;
  c.vocab_size = 13;
  c.context = 8;
  c.layers = 2;
  c.width = 8 * heads;
  c.heads = heads;
  c.experts = experts;
  return c;
}

// The blocks of a tensor-parallel model are the single-process model's, and
// so are its logits and the gradients of its blocks: for 2 ranks over 4
// heads, 2 ranks over 3 heads (uneven: 2 and 1) and 3 ranks over 3, dense
// and with experts.
TEST(TrainGptModel, TensorParallelModelIsTheSingleProcessModel) {
  struct Case {
    int ranks;
    int64_t heads;
    int64_t experts;
  };
  for (const auto& k : {Case{2, 4, 0}, Case{2, 3, 0}, Case{3, 3, 0}, Case{2, 2, 3}}) {
    SCOPED_TRACE("ranks " + std::to_string(k.ranks) + ", heads " + std::to_string(k.heads) +
                 ", experts " + std::to_string(k.experts));
    const auto c = small_model(k.heads, k.experts);
    at::manual_seed(7);
    train_gpt::Gpt whole(c);
    const auto tokens = at::randint(0, c.vocab_size, {3, c.context + 1}, at::kLong);
    auto loss = whole->loss(tokens);
    loss.backward();
    const auto logits = whole->forward(tokens.narrow(1, 0, c.context)).detach();
    const auto whole_params = whole->named_parameters();
    std::mutex global_generator;
    muon::test::run_ranks(k.ranks, [&](muon::distributed::Group& tp) {
      // Thread ranks share the global generator: one builds at a time.
      std::unique_lock<std::mutex> lock(global_generator);
      at::manual_seed(7);
      train_gpt::Gpt model(c, tp);
      lock.unlock();
      const auto shards = model->tensor_parallel_shards();
      // Per layer: qkv, proj, fc1 weight and bias, fc2 (experts: attention only).
      EXPECT_EQ(shards.size(), static_cast<size_t>(c.layers * (k.experts > 0 ? 2 : 5)));
      auto local_loss = model->loss(tokens);
      local_loss.backward();
      // fp32 forward and backward of a 2-layer model: the ranks sum partial
      // products over their heads or hidden units and add them in the
      // all-reduce, in another order than one GEMM; each such sum is within
      // a few units of rounding (6e-8 relative) of the other, and the model
      // amplifies that by far less than 100 on values of order 1.
      constexpr double kTol = 1e-5;
      EXPECT_NEAR(local_loss.item<double>(), loss.item<double>(), kTol);
      EXPECT_TRUE(at::allclose(model->forward(tokens.narrow(1, 0, c.context)), logits, kTol, kTol));
      // QK-clip's maxima of that forward: each rank's heads at their global
      // index (−∞ elsewhere), the MAX over the ranks the whole model's, and
      // the first row of the rank's fused QKV block.
      const auto maxima = muon::distributed::all_reduce_max(at::stack(model->max_logits()), tp);
      EXPECT_TRUE(at::allclose(maxima, at::stack(whole->max_logits()), kTol, kTol));
      const auto qkv_rows =
          tp.all_gather_ints({model->named_parameters()["blocks.0.attn.qkv.weight"].size(0)});
      int64_t qkv_begin = 0;
      for (int r = 0; r < tp.rank(); ++r) qkv_begin += qkv_rows[static_cast<size_t>(r)][0];
      EXPECT_EQ(model->qkv_row_begin(), qkv_begin);
      for (const auto& item : model->named_parameters()) {
        const auto& name = item.key();
        auto value = whole_params[name].detach();
        auto grad = whole_params[name].grad();
        const auto it = shards.find(name);
        if (it != shards.end()) {
          const auto dim = it->second.partition_dim();
          const auto sizes = tp.all_gather_ints({item.value().size(dim)});
          int64_t offset = 0;
          for (int r = 0; r < tp.rank(); ++r) offset += sizes[static_cast<size_t>(r)][0];
          value = value.narrow(dim, offset, item.value().size(dim));
          grad = grad.narrow(dim, offset, item.value().size(dim));
          EXPECT_EQ(it->second.global_shape(), whole_params[name].sizes().vec()) << name;
        }
        EXPECT_TRUE(at::equal(item.value().detach(), value)) << name << " initialized differently";
        EXPECT_TRUE(at::allclose(item.value().grad(), grad, kTol, kTol)) << name;
      }
    });
  }
}

// ---- the program ----

// A model and budget small enough for seconds per run, with 4 heads so that
// tensor parallelism runs at 4 ranks.
const std::string kTinyShape =
    "--layers 1 --width 32 --context 32 --batch 8 --chars 60000 --eval-every 5 "
    "--eval-windows 16 --no-progress --no-plot --threads 1 --timeout 120 ";
const std::string kTiny = kTinyShape + "--heads 4 ";

// Every matrix, embeddings and head included, to Muon (1-D parameters stay
// with AdamW): the "muon" run without the hybrid's routing.
const char* kAllMuon = R"({"overrides": [
  {"match": {"is_embedding": true}, "set": {"optimizer": "muon", "lr": 0.02}, "label": "embeddings"},
  {"match": {"is_head": true}, "set": {"optimizer": "muon", "lr": 0.02}, "label": "head"}]})";

struct Job {
  std::string parallel;
  int ranks;
  int tp;
};

std::string label(const Job& j) {
  return j.parallel + "-" + std::to_string(j.ranks) + (j.tp > 0 ? "-tp" + std::to_string(j.tp) : "");
}

// A finished job: each run's log and its summary (--summary).
struct Result {
  std::map<std::string, train_gpt::RunLog> logs;
  std::map<std::string, nlohmann::json> summary;
  std::string text;  // the program's output
};

// Runs muon-train-gpt with `args` as `job` under `dir`.
Result run_job(const fs::path& dir, const std::string& args, const Job& job,
               const std::vector<std::string>& runs) {
  const auto out = dir / label(job);
  std::string cmd = kTiny + args + " --nproc " + std::to_string(job.ranks) +
                    " --parallel " + job.parallel + " --out " + out.string() + " --summary " +
                    (out / "summary.json").string();
  if (job.tp > 0) cmd += " --tp " + std::to_string(job.tp);
  const auto o = run_program(cmd);
  EXPECT_EQ(o.status, 0) << cmd << "\n" << o.text;
  Result r;
  r.text = o.text;
  if (o.status != 0) return r;
  for (const auto& run : runs) r.logs[run] = train_gpt::read_csv((out / (run + ".csv")).string());
  std::ifstream in(out / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  for (const auto& s : summary.at("runs")) r.summary[s.at("name").get<std::string>()] = s;
  return r;
}

// Same global batches and initialization in every layout: a layout differs
// from one process only in the order of fp32 sums (gradients averaged over
// ranks, GEMMs split by heads or hidden units, reduce-scattered shards), each
// within a few units of rounding (6e-8 relative). Training amplifies such
// differences step by step (Newton–Schulz and Adam's normalization are
// sensitive to small inputs), but over 50 steps of this model they stay
// orders of magnitude below the loss changes they would hide: 1e-4 relative
// is what fp32 training reaches (the README's expectation), and a wrong
// update (a missed reduction, a shard stepped twice, a wrong block) moves
// the loss by more than 1e-2 within a few steps.
constexpr double kCurveTolerance = 1e-4;

// The vocabulary the program reports ("..., vocab N, ...").
int64_t vocab_of(const std::string& text) {
  const auto at = text.find(", vocab ");
  EXPECT_NE(at, std::string::npos) << text;
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + 8));
}

// muon::plan's prediction of what `job` sends per step and holds per rank
// is exact: the ring-model bytes the job counted, its optimizer state and
// its parameter bytes, for the hybrid (muon) and AdamW.
void expect_plan_exact(const Job& job, const Result& r, int64_t experts = 0) {
  const auto model = muon::plan::Model::gpt(1, 32, 4, vocab_of(r.text), 32, 8, 4, experts);
  const std::map<std::string, muon::plan::LayoutKind> kinds{
      {"ddp", muon::plan::LayoutKind::kLayerwise},
      {"sharded", muon::plan::LayoutKind::kSharded},
      {"tp", muon::plan::LayoutKind::kTensorParallel},
      {"tp,sharded", muon::plan::LayoutKind::kTensorParallelSharded}};
  for (const bool adamw : {false, true}) {
    if (r.summary.count(adamw ? "adamw" : "muon") == 0) continue;
    muon::plan::Options o;
    o.world = job.ranks;
    o.tp = job.tp;
    o.adamw_only = adamw;
    const auto p = muon::plan::predict(model, muon::plan::Machine::preset("h100"), kinds.at(job.parallel), o);
    ASSERT_TRUE(p.why_not.empty()) << p.why_not;
    const auto& s = r.summary.at(adamw ? "adamw" : "muon");
    EXPECT_EQ(p.bytes_sent, s.at("bytes_sent_per_step").get<int64_t>()) << (adamw ? "adamw" : "muon");
    EXPECT_EQ(p.state_bytes, s.at("optimizer_state_bytes").get<int64_t>()) << (adamw ? "adamw" : "muon");
    EXPECT_EQ(p.parameter_bytes, s.at("parameter_bytes").get<int64_t>()) << (adamw ? "adamw" : "muon");
  }
}

// Every layout at `ranks`, for the hybrid (muon), AdamW and Muon on every
// matrix, against one process; the costs per rank each layout promises,
// and muon::plan's prediction of them.
void expect_layouts_match(int ranks, const std::vector<Job>& jobs) {
  const auto dir = scratch("layouts_" + std::to_string(ranks));
  {
    std::ofstream(dir / "all_muon.json") << kAllMuon;
  }
  const std::string hybrid = "--steps 50 --runs muon,adamw";
  const std::string all_muon = "--steps 50 --runs muon --config muon=" + (dir / "all_muon.json").string();
  const auto base = run_job(dir / "hybrid", hybrid, {"single", 1, 0}, {"muon", "adamw"});
  const auto base_all = run_job(dir / "all", all_muon, {"single", 1, 0}, {"muon"});
  ASSERT_FALSE(base.logs.empty() || base_all.logs.empty());
  for (const auto& job : jobs) {
    SCOPED_TRACE(label(job));
    const auto r = run_job(dir / "hybrid", hybrid, job, {"muon", "adamw"});
    const auto a = run_job(dir / "all", all_muon, job, {"muon"});
    if (r.logs.empty() || a.logs.empty()) continue;
    const double d_hybrid = largest_difference(r.logs.at("muon"), base.logs.at("muon"));
    const double d_adamw = largest_difference(r.logs.at("adamw"), base.logs.at("adamw"));
    const double d_muon = largest_difference(a.logs.at("muon"), base_all.logs.at("muon"));
    std::printf("%-14s hybrid %.2e  adamw %.2e  muon %.2e (largest relative loss difference)\n",
                label(job).c_str(), d_hybrid, d_adamw, d_muon);
    EXPECT_LE(d_hybrid, kCurveTolerance);
    EXPECT_LE(d_adamw, kCurveTolerance);
    EXPECT_LE(d_muon, kCurveTolerance);
    // The training moved: a layout that did not step would differ by much more.
    EXPECT_LT(r.logs.at("muon").final_point().valid_loss,
              r.logs.at("muon").points.front().valid_loss - 0.3);

    expect_plan_exact(job, r);
    const auto& one = base.summary.at("muon");
    const auto& mine = r.summary.at("muon");
    const auto state = [](const nlohmann::json& s) { return s.at("optimizer_state_bytes").get<double>(); };
    const auto params = [](const nlohmann::json& s) { return s.at("parameter_bytes").get<double>(); };
    // The attention and MLP matrices (and fc1's bias) are split by tensor
    // parallelism: per layer 3d² + d² + 4d² + 4d + 4d² elements of 4 bytes,
    // d = 32. Their share of the optimizer state: Muon's momentum (one value
    // per element).
    const double split = 4.0 * (12 * 32 * 32 + 4 * 32);
    if (job.parallel == "sharded") {
      // Each rank holds the state of its rows only: total / ranks, within 10%.
      EXPECT_NEAR(state(mine), state(one) / ranks, 0.1 * state(one) / ranks);
    }
    if (job.parallel == "tp,sharded") {
      // Blocks sharded over all ranks; the replicated rest over the
      // data-parallel ranks only (ranks / tp).
      const double expected = split / ranks + (state(one) - split) / (ranks / job.tp);
      EXPECT_NEAR(state(mine), expected, 0.1 * expected);
    }
    if (job.parallel == "tp") {
      const int tp = job.tp > 0 ? job.tp : ranks;
      EXPECT_DOUBLE_EQ(params(mine), params(one) - split + split / tp);
    }
  }
  fs::remove_all(dir);
}

TEST(TrainGptLayouts, EveryLayoutAtTwoRanksGivesTheSingleProcessCurve) {
  expect_layouts_match(2, {{"ddp", 2, 0}, {"sharded", 2, 0}, {"tp", 2, 0}});
}

TEST(TrainGptLayouts, EveryLayoutAtFourRanksGivesTheSingleProcessCurve) {
  expect_layouts_match(4, {{"ddp", 4, 0}, {"sharded", 4, 0}, {"tp", 4, 0}, {"tp", 4, 2},
                           {"tp,sharded", 4, 2}});
}

TEST(TrainGptLayouts, ExpertsGiveTheSingleProcessCurveInEveryLayout) {
  // 3 experts: uneven over 2 ranks in the sharded layouts (2 and 1).
  const auto dir = scratch("experts");
  const std::string args = "--steps 30 --runs muon --experts 3";
  const auto base = run_job(dir, args, {"single", 1, 0}, {"muon"});
  ASSERT_FALSE(base.logs.empty());
  for (const auto& job : {Job{"ddp", 2, 0}, Job{"sharded", 2, 0}, Job{"tp", 2, 0},
                          Job{"tp,sharded", 4, 2}}) {
    SCOPED_TRACE(label(job));
    const auto r = run_job(dir, args, job, {"muon"});
    if (r.logs.empty()) continue;
    const double d = largest_difference(r.logs.at("muon"), base.logs.at("muon"));
    std::printf("experts %-14s %.2e\n", label(job).c_str(), d);
    expect_plan_exact(job, r, 3);
    EXPECT_LE(d, kCurveTolerance);
  }
  fs::remove_all(dir);
}

TEST(TrainGptLayouts, CheckpointsMoveBetweenLayouts) {
  // 10 steps sharded at 2 ranks, continued 2-D at 4 ranks, then tensor
  // parallel at 2: the curve of 20 steps in one process.
  const auto dir = scratch("layout_resume");
  const std::string common = "--runs muon --set all:lr_decay_steps=20 --set all:lr_warmup_steps=2 ";
  const auto straight = run_job(dir, common + "--steps 20", {"single", 1, 0}, {"muon"});
  const auto ckpt = (dir / "ckpt").string();
  run_job(dir, common + "--steps 10 --save " + ckpt, {"sharded", 2, 0}, {"muon"});
  const auto two_d = run_job(dir, common + "--steps 15 --save " + ckpt + " --resume " + ckpt,
                            {"tp,sharded", 4, 2}, {"muon"});
  const auto last = run_job(dir, common + "--steps 20 --resume " + ckpt, {"tp", 2, 0}, {"muon"});
  ASSERT_FALSE(straight.logs.empty() || last.logs.empty());
  // The resume line counts every rank of each run, tensor-parallel ones too.
  EXPECT_NE(two_d.text.find("(written by 2 ranks, "), std::string::npos) << two_d.text;
  EXPECT_NE(two_d.text.find("; this run: 4 ranks, "), std::string::npos) << two_d.text;
  EXPECT_NE(last.text.find("(written by 4 ranks, "), std::string::npos) << last.text;
  EXPECT_NE(last.text.find("; this run: 2 ranks, "), std::string::npos) << last.text;
  EXPECT_LE(largest_difference(last.logs.at("muon"), straight.logs.at("muon")), kCurveTolerance);
  fs::remove_all(dir);
}

TEST(TrainGptLayouts, CompareLayoutsPrintsOneTable) {
  const auto dir = scratch("compare");
  const auto out = run_program(kTiny + "--steps 5 --runs muon --compare-layouts "
                               "--compare-ranks 2 --out " + dir.string());
  ASSERT_EQ(out.status, 0) << out.text;
  for (const auto* row : {"muon     single", "muon     ddp", "muon     sharded", "muon     tp"}) {
    EXPECT_NE(out.text.find(row), std::string::npos) << row << "\n" << out.text;
  }
  EXPECT_NE(out.text.find("opt state"), std::string::npos) << out.text;
  EXPECT_TRUE(fs::exists(dir / "layouts" / "layouts.txt"));
  fs::remove_all(dir);
}

TEST(TrainGptLayouts, LayoutsTheRanksCannotFormFailInOneLine) {
  const std::string tiny = kTinyShape + "--steps 2 --runs muon ";
  const auto single = run_program(tiny + "--heads 4 --parallel single --nproc 2");
  EXPECT_NE(single.status, 0);
  EXPECT_NE(single.text.find("--parallel single runs one process, got 2 ranks"), std::string::npos)
      << single.text;
  const auto divide = run_program(tiny + "--heads 4 --parallel tp,sharded --tp 3 --nproc 4");
  EXPECT_NE(divide.status, 0);
  EXPECT_NE(divide.text.find("--tp 3 must divide the number of ranks 4"), std::string::npos)
      << divide.text;
  const auto heads = run_program(tiny + "--parallel tp --heads 2 --nproc 4");
  EXPECT_NE(heads.status, 0);
  EXPECT_NE(heads.text.find("--tp 4 splits the attention by heads; the model has --heads 2"),
            std::string::npos)
      << heads.text;
  const auto stray = run_program(tiny + "--heads 4 --parallel sharded --tp 2 --nproc 2");
  EXPECT_NE(stray.status, 0);
  EXPECT_NE(stray.text.find("--tp 2 needs --parallel tp or tp,sharded"), std::string::npos)
      << stray.text;
}

}  // namespace
