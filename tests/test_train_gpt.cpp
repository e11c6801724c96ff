// The train_gpt example's pieces: corpus, vocabulary, batches, model,
// logs and table, checkpoint resume.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/cuda.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint_run.h"
#include "data.h"
#include "gpt.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/optim/hybrid.h"
#include "muon/qk_clip.h"
#include "report.h"
#include "train_gpt_util.h"
#include "trainer.h"

namespace {

using train_gpt_test::Output;
using train_gpt_test::run_program;
using train_gpt_test::run_program_command;
using train_gpt_test::scratch;

using train_gpt::EvalPoint;
using train_gpt::RunLog;

TEST(TrainGptData, CorpusIsDeterministicAndSeeded) {
  const auto a = train_gpt::generate_corpus(20000, 5);
  const auto b = train_gpt::generate_corpus(20000, 5);
  const auto c = train_gpt::generate_corpus(20000, 6);
  EXPECT_EQ(a.size(), 20000u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Documents (blank-line separated), sentences and numbered lists are there.
  EXPECT_NE(a.find("\n\n"), std::string::npos);
  EXPECT_NE(a.find(". "), std::string::npos);
  EXPECT_NE(a.find("\n1. "), std::string::npos);
  EXPECT_THROW(train_gpt::generate_corpus(0), c10::ValueError);
}

TEST(TrainGptData, VocabularyRoundTrips) {
  const std::string text = "hello, world\n";
  const auto vocab = train_gpt::CharVocab::from_text(text);
  EXPECT_EQ(vocab.size(), 10);  // h e l o , space w r d \n
  const auto tokens = vocab.encode(text);
  EXPECT_EQ(tokens.numel(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(vocab.decode(tokens), text);
  EXPECT_THROW(vocab.encode("hex"), c10::ValueError);
  EXPECT_EQ(train_gpt::CharVocab::from_text(text, /*byte_level=*/true).size(), 256);
}

TEST(TrainGptData, GlobalBatchIsTheSameForEveryWorldSize) {
  const auto tokens = at::arange(1000, at::kLong);
  const auto whole = train_gpt::train_batch(tokens, 7, 12, 16, 0, 1, 3);
  ASSERT_EQ(whole.sizes(), (std::vector<int64_t>{12, 17}));
  for (const int64_t world : {2, 3, 4}) {
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < world; ++r) {
      parts.push_back(train_gpt::train_batch(tokens, 7, 12, 16, r, world, 3));
    }
    EXPECT_TRUE(at::equal(at::cat(parts), whole)) << "world " << world;
  }
  // Windows are consecutive tokens; another step draws other windows.
  EXPECT_TRUE(at::equal(whole.select(1, 16) - whole.select(1, 0), at::full({12}, 16, at::kLong)));
  EXPECT_FALSE(at::equal(train_gpt::train_batch(tokens, 8, 12, 16, 0, 1, 3), whole));
  EXPECT_THROW(train_gpt::train_batch(tokens, 0, 10, 16, 0, 3, 3), c10::ValueError);
}

// The model of the TrainGptModel tests: a vocabulary of 11, context 8, 2
// blocks of width 16 with `heads` heads.
train_gpt::GptConfig small_config(int64_t heads) {
  train_gpt::GptConfig c;
  c.vocab_size = 11;
  c.context = 8;
  c.layers = 2;
  c.width = 16;
  c.heads = heads;
  return c;
}

TEST(TrainGptModel, ShapesNamesAndCausality) {
  auto c = small_config(2);
  at::manual_seed(0);
  train_gpt::Gpt model(c);
  const auto tokens = at::randint(0, 11, {3, 8}, at::kLong);
  const auto logits = model->forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 8, 11}));
  // Changing the last token leaves the logits of every earlier position unchanged.
  auto changed = tokens.clone();
  changed.select(1, 7).fill_(0);
  changed.select(1, 7).add_(tokens.select(1, 7).add(1).remainder(11));
  const auto logits2 = model->forward(changed);
  EXPECT_TRUE(at::allclose(logits.narrow(1, 0, 7), logits2.narrow(1, 0, 7), 1e-6, 1e-6));
  EXPECT_FALSE(at::allclose(logits.narrow(1, 7, 1), logits2.narrow(1, 7, 1), 1e-6, 1e-6));
  // GPT-2 names: the default routing sends embeddings and the head to AdamW.
  const auto named = model->named_parameters();
  EXPECT_NE(named.find("wte.weight"), nullptr);
  EXPECT_NE(named.find("lm_head.weight"), nullptr);
  EXPECT_NE(named.find("blocks.1.attn.qkv.weight"), nullptr);
  muon::MuonWithAdamW opt(named);
  for (const auto& d : opt.routing()) {
    const bool matrix = d.shape.size() == 2 && d.name.find("wte") == std::string::npos &&
                        d.name.find("wpe") == std::string::npos &&
                        d.name.find("lm_head") == std::string::npos;
    EXPECT_EQ(d.route == muon::Route::kMuon, matrix) << d.name;
  }
  // A fresh model predicts roughly uniformly: loss ≈ ln(vocab).
  EXPECT_NEAR(model->loss(at::randint(0, 11, {4, 9}, at::kLong)).item<double>(), std::log(11.0), 0.3);
  c.heads = 3;
  EXPECT_THROW(train_gpt::Gpt{c}, c10::ValueError);
}

// The attention's recorded maxima are the largest causal logits q_i·k_j/√d
// of each head (recomputed here in fp64 from the fused weight's rows per
// head [q_h; k_h; v_h] and the block's input), and muon::qk_clip_ with
// QkvRows::kGrouped on that weight brings a clipped head's maximum to τ:
// the model and the clip agree on the rows. In fp64 (the model cast) the
// comparisons hold to ~1e-15 relative; 1e-9 leaves room for any BLAS order.
TEST(TrainGptModel, MaxLogitsAndQkClipOfTheFusedWeight) {
  const auto c = small_config(4);
  at::manual_seed(0);
  train_gpt::Gpt model(c);
  model->to(at::kDouble);
  const auto tokens = at::randint(0, 11, {3, 8}, at::kLong);
  EXPECT_FALSE(model->max_logits()[0].defined());
  {
    at::NoGradGuard no_grad;  // evaluation records nothing
    model->forward(tokens);
  }
  EXPECT_FALSE(model->max_logits()[0].defined());
  model->forward(tokens);
  const auto maxima = model->max_logits();
  ASSERT_EQ(maxima.size(), 2u);
  ASSERT_EQ(maxima[0].numel(), 4);
  EXPECT_EQ(maxima[0].scalar_type(), at::kDouble);

  at::NoGradGuard no_grad;
  const auto params = model->named_parameters();
  const auto modules = model->named_modules();
  const auto emb = params["wte.weight"].index_select(0, tokens.reshape({-1})).view({3, 8, 16}) +
                   params["wpe.weight"].narrow(0, 0, 8);
  const auto x = modules["blocks.0.norm1"]->as<train_gpt::NormImpl>()->forward(emb);
  auto qkv = params["blocks.0.attn.qkv.weight"];
  const int64_t d = 4;
  auto head_max = [&](int64_t h) {
    const auto q = at::matmul(x, qkv.narrow(0, h * 3 * d, d).t());
    const auto k = at::matmul(x, qkv.narrow(0, h * 3 * d + d, d).t());
    const auto s = at::matmul(q, k.transpose(1, 2)) / 2.0;  // √d = 2
    const auto causal = at::ones({8, 8}, at::kBool).tril();
    return s.masked_fill(causal.logical_not(), -INFINITY).max().item<double>();
  };
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_NEAR(maxima[0][h].item<double>(), head_max(h), 1e-9 * std::abs(head_max(h))) << h;
  }
  // Clip block 0 at τ below heads 0 and 2's maxima only (its input is the same afterwards).
  auto m = maxima[0].clone();
  m[1] = 0.1 * std::abs(m[1].item<double>());
  m[3] = 0.1 * std::abs(m[3].item<double>());
  const double tau = 0.5 * std::min(m[0].item<double>(), m[2].item<double>());
  ASSERT_GT(tau, std::max(m[1].item<double>(), m[3].item<double>()));
  const auto before = qkv.clone();
  const auto gamma = muon::qk_clip_({muon::QkClipWeight(qkv, muon::QkvRows::kGrouped)}, m,
                                    muon::QkClipOptions(4, d).threshold(tau));
  for (const int64_t h : {0, 2}) {
    EXPECT_NEAR(head_max(h), gamma[h].item<double>() * maxima[0][h].item<double>(), 1e-9 * tau)
        << h;
  }
  EXPECT_NEAR(head_max(0), tau, 1e-9 * tau);
  for (const int64_t h : {1, 3}) {
    EXPECT_TRUE(at::equal(qkv.narrow(0, h * 3 * d, 3 * d), before.narrow(0, h * 3 * d, 3 * d)))
        << h;
  }
  // V rows of the clipped heads unchanged.
  EXPECT_TRUE(at::equal(qkv.narrow(0, 2 * d, d), before.narrow(0, 2 * d, d)));
}

RunLog make_log(std::vector<std::pair<int64_t, double>> points) {
  RunLog log{"x", {}, {}};
  for (const auto& [step, loss] : points) {
    log.points.push_back({step, step * 10, loss, loss, 0.5 * static_cast<double>(step), 0.1 * static_cast<double>(step)});
  }
  return log;
}

TEST(TrainGptReport, StepsToReachInterpolates) {
  const auto log = make_log({{0, 4.0}, {10, 3.0}, {20, 2.0}, {30, 1.5}});
  EXPECT_DOUBLE_EQ(log.steps_to_reach(2.5), 15.0);
  EXPECT_DOUBLE_EQ(log.steps_to_reach(3.0), 10.0);
  EXPECT_DOUBLE_EQ(log.steps_to_reach(5.0), 0.0);
  EXPECT_DOUBLE_EQ(log.steps_to_reach(1.0), -1.0);
  EXPECT_DOUBLE_EQ(log.seconds_per_step(), 0.5);
  EXPECT_DOUBLE_EQ(log.optimizer_share(), 0.2);
}

TEST(TrainGptReport, CsvRoundTripAndTable) {
  auto a = make_log({{0, 4.0}, {10, 3.0}, {20, 2.0}});
  a.name = "fast";
  a.points[0].train_loss = std::numeric_limits<double>::quiet_NaN();
  auto b = make_log({{0, 4.0}, {10, 3.5}, {20, 3.0}});
  b.name = "slow";
  const auto dir = scratch("csv");
  const auto path = (dir / "fast.csv").string();
  train_gpt::write_csv(a, path);
  const auto back = train_gpt::read_csv(path);
  EXPECT_EQ(back.name, "fast");
  ASSERT_EQ(back.points.size(), 3u);
  EXPECT_TRUE(std::isnan(back.points[0].train_loss));
  EXPECT_DOUBLE_EQ(back.points[2].valid_loss, 2.0);
  EXPECT_EQ(back.points[2].tokens, 200);
  // fast reaches slow's final loss (3.0) at step 10, slow at 20: 0.50x.
  a.cost.optimizer_state_bytes = 3 << 20;  // b's cost is unknown, as for a run read from its CSV
  const auto table = train_gpt::comparison_table({a, b}, 1);
  EXPECT_NE(table.find("10 (0.50x)"), std::string::npos) << table;
  EXPECT_NE(table.find("20 (1.00x)"), std::string::npos) << table;
  EXPECT_NE(table.find("state/rank"), std::string::npos) << table;
  EXPECT_NE(table.find("3.00 MiB"), std::string::npos) << table;
  EXPECT_NE(table.find("- "), std::string::npos) << table;
  // A long run name widens the name column instead of shifting the others.
  b.name = "a_long_registry_name";
  const auto wide = train_gpt::comparison_table({a, b}, 1);
  const auto header = wide.substr(0, wide.find('\n'));
  EXPECT_EQ(header.find("val loss"), header.find("run") + 20 + 1 + 2) << wide;
  std::filesystem::remove_all(dir);
}

train_gpt::TrainOptions tiny_run() {
  train_gpt::TrainOptions o;
  o.model.context = 16;
  o.model.layers = 1;
  o.model.width = 16;
  o.model.heads = 2;
  o.global_batch = 4;
  o.eval_every = 2;
  o.eval_windows = 8;
  o.progress = false;
  return o;
}

std::unique_ptr<torch::optim::Optimizer> make_hybrid(train_gpt::Gpt& model) {
  muon::MuonWithAdamWOptions o;
  o.adamw(torch::optim::AdamWOptions(1e-2));
  return std::make_unique<muon::MuonWithAdamW>(model->named_parameters(), o);
}

TEST(TrainGptTrainer, LossDecreasesAndResumeContinuesTheCurve) {
  const auto data = train_gpt::make_dataset(train_gpt::generate_corpus(20000));
  const auto dir = scratch("resume");
  auto o = tiny_run();
  o.steps = 12;
  const auto straight = train_gpt::train(data, o, make_hybrid, {});
  ASSERT_EQ(straight.points.size(), 7u);  // steps 0, 2, ..., 12
  // From ln(vocab) ≈ 3.7 down by well over the noise of 8 validation windows.
  EXPECT_LT(straight.final_point().valid_loss, straight.points[0].valid_loss - 0.3);

  // Checkpoints at steps 3 and 6: step 6 is at a log point, step 3 between
  // two (its manifest carries the training loss of step 3 for the point of
  // step 4).
  auto first = o;
  first.steps = 6;
  first.save_every = 3;
  first.save_dir = (dir / "ckpt").string();
  train_gpt::train(data, first, make_hybrid, {});
  ASSERT_TRUE(std::filesystem::exists(dir / "ckpt" / "step-00000003" / "manifest.json"));
  ASSERT_TRUE(std::filesystem::exists(dir / "ckpt" / "step-00000006" / "manifest.json"));
  auto second = o;
  second.resume = first.save_dir;
  auto expect_straight = [&](const RunLog& resumed, const char* from) {
    ASSERT_EQ(resumed.points.size(), straight.points.size()) << from;
    // The step-0 point's NaN training loss came back through the manifest's JSON.
    EXPECT_TRUE(std::isnan(resumed.points[0].train_loss)) << from;
    for (size_t i = 0; i < straight.points.size(); ++i) {
      EXPECT_EQ(resumed.points[i].step, straight.points[i].step) << from;
      EXPECT_EQ(resumed.points[i].tokens, straight.points[i].tokens) << from;
      // Same batches, same state: bit-identical losses.
      EXPECT_EQ(resumed.points[i].valid_loss, straight.points[i].valid_loss) << from << " " << i;
      if (i > 0) {
        EXPECT_EQ(resumed.points[i].train_loss, straight.points[i].train_loss) << from << " " << i;
      }
    }
  };
  expect_straight(train_gpt::train(data, second, make_hybrid, {}), "step 6");
  // Without step 6, the newest complete checkpoint is step 3.
  std::filesystem::remove_all(dir / "ckpt" / "step-00000006");
  expect_straight(train_gpt::train(data, second, make_hybrid, {}), "step 3");
  // Resumed at its last step: no step taken, the log ends with step 3's
  // point, as a run of 3 steps does.
  auto three = o;
  three.steps = 3;
  const auto short_run = train_gpt::train(data, three, make_hybrid, {});
  three.resume = first.save_dir;
  const auto resumed_at_end = train_gpt::train(data, three, make_hybrid, {});
  ASSERT_EQ(resumed_at_end.points.size(), short_run.points.size());  // steps 0, 2, 3
  EXPECT_EQ(resumed_at_end.final_point().step, 3);
  EXPECT_EQ(resumed_at_end.final_point().tokens, short_run.final_point().tokens);
  EXPECT_EQ(resumed_at_end.final_point().train_loss, short_run.final_point().train_loss);
  EXPECT_EQ(resumed_at_end.final_point().valid_loss, short_run.final_point().valid_loss);
  // Another model shape: named by its flag, before anything is loaded.
  auto wider = second;
  wider.model.width = 32;
  try {
    train_gpt::train(data, wider, make_hybrid, {});
    ADD_FAILURE() << "a checkpoint of width 16 resumed at width 32";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("was written with --width 16, this run has --width 32"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

// ---- the program, as a user runs it: real processes through muon-launch ----

namespace {

// A model and budget small enough for seconds per run.
const char* kTiny =
    "--layers 1 --width 32 --heads 2 --context 32 --batch 8 --chars 60000 --eval-every 5 "
    "--eval-windows 16 --no-progress --threads 1";


TEST(TrainGptProgram, TwoRanksThroughTheLauncher) {
  const auto dir = scratch("two_ranks");
  const auto out = run_program(std::string(kTiny) + " --nproc 2 --steps 20 --out " + dir.string());
  ASSERT_EQ(out.status, 0) << out.text;
  EXPECT_NE(out.text.find("[rank 0] muon-train-gpt: 2 rank(s)"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("steps to baseline's loss"), std::string::npos) << out.text;
  for (const auto* run : {"muon", "adamw"}) {
    const auto log = train_gpt::read_csv((dir / (std::string(run) + ".csv")).string());
    ASSERT_EQ(log.points.size(), 5u) << run;  // steps 0, 5, 10, 15, 20
    EXPECT_LT(log.final_point().valid_loss, log.points[0].valid_loss - 0.3) << run;
  }
  EXPECT_GT(std::filesystem::file_size(dir / "loss.png"), 10000u);
  std::filesystem::remove_all(dir);
}

// A user optimizer from a plugin (tests/plugins/sign_descent.cpp) is a run
// like a built-in: configured from a JSON file, trained on 2 ranks (layer-wise
// optimizer), checkpointed at step 10 and resumed to step 20 on the same
// curve.
TEST(TrainGptProgram, APluginOptimizerTrainsFromAConfigAndResumes) {
  const auto dir = scratch("plugin");
  {
    std::ofstream json(dir / "sign_descent.json");
    json << R"({"lr": 0.003, "sign_descent_beta": 0.9})";
  }
  // The schedule is fixed in the config (the presets derive it from --steps).
  const std::string common = std::string(kTiny) + " --nproc 2 --no-plot --runs sign_descent --plugin " +
                             MUON_SIGN_DESCENT_PLUGIN + " --config sign_descent=" +
                             (dir / "sign_descent.json").string() +
                             " --set all:lr_decay_steps=20 --set all:lr_warmup_steps=2 ";
  const auto straight = run_program(common + "--steps 20 --out " + (dir / "straight").string());
  ASSERT_EQ(straight.status, 0) << straight.text;
  const auto log = train_gpt::read_csv((dir / "straight" / "sign_descent.csv").string());
  ASSERT_EQ(log.points.size(), 5u);  // steps 0, 5, 10, 15, 20
  EXPECT_LT(log.final_point().valid_loss, log.points[0].valid_loss - 0.3);
  const auto ckpt = dir / "ckpt";
  const auto first = run_program(common + "--steps 10 --save " + ckpt.string() + " --out " + (dir / "r").string());
  ASSERT_EQ(first.status, 0) << first.text;
  const auto resumed = run_program(common + "--steps 20 --resume " + ckpt.string() + " --out " + (dir / "r").string());
  ASSERT_EQ(resumed.status, 0) << resumed.text;
  const auto again = train_gpt::read_csv((dir / "r" / "sign_descent.csv").string());
  ASSERT_EQ(again.points.size(), log.points.size());
  // Same ranks, same batches, the momentum restored from the checkpoint:
  // bit-identical losses.
  EXPECT_EQ(again.final_point().valid_loss, log.final_point().valid_loss);
  std::filesystem::remove_all(dir);
}

// A plugin that registers a taken name (tests/plugins/duplicate_name.cpp
// registers `muon`), or a copy of a loaded plugin at another path, ends the
// program with one line naming the path and the name and status 1 (it used
// to abort inside dlopen).
TEST(TrainGptProgram, APluginThatRegistersATakenNameIsOneLine) {
  const auto dir = scratch("plugin_taken");
  const auto copy = (dir / "libsign_descent_copy.so").string();
  std::filesystem::copy_file(MUON_SIGN_DESCENT_PLUGIN, copy);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string(" --plugin ") + MUON_DUPLICATE_PLUGIN, "optimizer 'muon' is already registered"},
      {std::string(" --plugin ") + MUON_SIGN_DESCENT_PLUGIN + " --plugin " + copy,
       "optimizer 'sign_descent' is already registered"}};
  for (const auto& [flags, reason] : cases) {
    const auto out = run_program(std::string(kTiny) + " --runs muon --print-config" + flags);
    EXPECT_EQ(out.status, 1) << out.text;
    EXPECT_NE(out.text.find("is refused and nothing it registers is added"), std::string::npos)
        << out.text;
    EXPECT_NE(out.text.find(reason), std::string::npos) << out.text;
    EXPECT_EQ(std::count(out.text.begin(), out.text.end(), '\n'), 1) << out.text;
  }
  std::filesystem::remove_all(dir);
}

// Runs `cmd` through the shell; its exit status and output (stdout and stderr).
std::pair<int, std::string> shell(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string text;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe) != nullptr) text += buf;
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

TEST(TrainGptProgram, RunsUnderTorchrun) {
  if (!std::filesystem::exists("/usr/bin/torchrun")) GTEST_SKIP() << "torchrun is not installed";
  const auto dir = scratch("torchrun");
  // Debian's torchrun (PyTorch 1.13) spells the flag --no_python, and on
  // Python 3.11 needs explicit per-rank --redirects/--tee maps.
  const std::string args = " --no_python --standalone --nproc_per_node 2 "
                           "--redirects 0:1,1:1 --tee 0:1,1:1 --log_dir " + (dir / "logs").string() +
                           " " + MUON_TRAIN_GPT_BIN + " " + kTiny + " --steps 10 --no-plot --out " +
                           (dir / "out").string();
  auto [status, text] = shell("/usr/bin/torchrun" + args);
  const std::string python = MUON_PYTHON_EXE;
  if (status != 0 && text.find("libuv") != std::string::npos && !python.empty()) {
    // Debian 13's torchrun 2.6 cannot start any job (its rendezvous asks for
    // a libuv store; that torch has no libuv). The documented workaround,
    // python3 -m muon_cpp.torchrun, runs the same command.
    std::tie(status, text) =
        shell("PYTHONPATH=" + std::string(MUON_PYTHON_PATH) + " " + python + " -m muon_cpp.torchrun" + args);
  }
  ASSERT_EQ(status, 0) << text;
  EXPECT_NE(text.find("2 rank(s)"), std::string::npos) << text;
  for (const auto* run : {"muon", "adamw"}) {
    const auto log = train_gpt::read_csv((dir / "out" / (std::string(run) + ".csv")).string());
    EXPECT_EQ(log.points.size(), 3u) << run;  // steps 0, 5, 10
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, OneAndTwoRanksGiveTheSameCurve) {
  const auto one = scratch("one_rank");
  const auto two = scratch("two_rank");
  const std::string common = std::string(kTiny) + " --steps 15 --no-plot --runs muon ";
  ASSERT_EQ(run_program(common + "--nproc 1 --out " + one.string()).status, 0);
  ASSERT_EQ(run_program(common + "--nproc 2 --out " + two.string()).status, 0);
  const auto a = train_gpt::read_csv((one / "muon.csv").string());
  const auto b = train_gpt::read_csv((two / "muon.csv").string());
  ASSERT_EQ(a.points.size(), b.points.size());
  for (size_t i = 0; i < a.points.size(); ++i) {
    // Same global batch and initialization; the ranks differ from one process
    // only in float rounding: the gradient is a mean of two half-batch means,
    // and each rank's BLAS sums in its own order. Over 15 steps that moves
    // the loss (about 2-4 nats) by far less than 1e-3.
    EXPECT_NEAR(a.points[i].valid_loss, b.points[i].valid_loss, 1e-3) << "step " << a.points[i].step;
    if (i > 0) {
      EXPECT_NEAR(a.points[i].train_loss, b.points[i].train_loss, 1e-3) << "step " << a.points[i].step;
    }
  }
  std::filesystem::remove_all(one);
  std::filesystem::remove_all(two);
}

// --qk-clip: the largest attention logit per block printed at each log
// point, heads clipped after the steps whose maximum exceeded τ, in the
// data-parallel, the tensor-parallel (heads split over the ranks) and the
// sharded layout (master rows clipped too) alike; the run trains.
TEST(TrainGptProgram, QkClipPrintsAndClipsTheLogits) {
  const std::string common =
      std::string(kTiny) + " --steps 10 --no-plot --runs muon --qk-clip 0.03 --nproc 2 ";
  std::vector<std::string> first_lines;
  for (const std::string parallel : {"ddp", "tp", "sharded"}) {
    const auto dir = scratch("qk_clip_" + parallel);
    const auto out = run_program(common + "--parallel " + parallel + " --out " + dir.string());
    ASSERT_EQ(out.status, 0) << out.text;
    const auto at5 = out.text.find("[rank 0] run 'muon' step 5: max attention logit per block ");
    ASSERT_NE(at5, std::string::npos) << out.text;
    first_lines.push_back(out.text.substr(at5, out.text.find(';', at5) - at5));
    EXPECT_NE(out.text.find("run 'muon' step 10: max attention logit per block "),
              std::string::npos);
    // τ = 0.03 is below a fresh model's logits (about 0.05): heads are clipped.
    const std::string clipped = "(qk-clip 0.03: ";
    const auto clips = out.text.find(clipped, at5);
    ASSERT_NE(clips, std::string::npos) << out.text;
    EXPECT_GT(std::stoll(out.text.substr(clips + clipped.size())), 0) << out.text;
    const auto log = train_gpt::read_csv((dir / "muon.csv").string());
    EXPECT_LT(log.final_point().valid_loss, log.points[0].valid_loss) << parallel;
    std::filesystem::remove_all(dir);
  }
  EXPECT_EQ(first_lines[0], first_lines[1]) << "ddp and tp see the same logits (to two decimals)";
  EXPECT_EQ(first_lines[0], first_lines[2])
      << "ddp and sharded see the same logits (to two decimals)";
  const auto bad = run_program(std::string(kTiny) + " --steps 2 --qk-clip -1 --nproc 1");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.text.find("--qk-clip"), std::string::npos) << bad.text;
}

TEST(TrainGptProgram, ResumeFromCheckpointContinuesTheCurve) {
  const auto straight = scratch("straight");
  const auto resumed = scratch("resumed");
  const auto ckpt = scratch("ckpt");
  // The presets derive the LR schedule from --steps; a run that is continued
  // fixes it in its config instead.
  const std::string common = std::string(kTiny) +
                             " --nproc 2 --no-plot --runs muon --set all:lr_decay_steps=20 "
                             "--set all:lr_warmup_steps=2 ";
  ASSERT_EQ(run_program(common + "--steps 20 --out " + straight.string()).status, 0);
  ASSERT_EQ(run_program(common + "--steps 10 --save " + ckpt.string() + " --out " + resumed.string()).status, 0);
  EXPECT_TRUE(std::filesystem::exists(ckpt / "muon" / "step-00000010" / "manifest.json"));
  const auto out = run_program(common + "--steps 20 --resume " + ckpt.string() + " --out " + resumed.string());
  ASSERT_EQ(out.status, 0) << out.text;
  EXPECT_NE(out.text.find("run 'muon': resumed from step 10 of " +
                          (ckpt / "muon" / "step-00000010").string() +
                          " (written by 2 ranks, layer-wise; this run: 2 ranks, layer-wise)"),
            std::string::npos)
      << out.text;
  // The comparison table follows, as after a run from scratch.
  EXPECT_NE(out.text.find("steps to baseline's loss"), std::string::npos) << out.text;
  const auto a = train_gpt::read_csv((straight / "muon.csv").string());
  const auto b = train_gpt::read_csv((resumed / "muon.csv").string());
  ASSERT_EQ(a.points.size(), b.points.size());
  for (size_t i = 0; i < a.points.size(); ++i) {
    // Same ranks, same batches, restored state: bit-identical losses.
    EXPECT_EQ(a.points[i].valid_loss, b.points[i].valid_loss) << "step " << a.points[i].step;
    if (i > 0) {
      EXPECT_EQ(a.points[i].train_loss, b.points[i].train_loss) << "step " << a.points[i].step;
    }
  }
  std::filesystem::remove_all(straight);
  std::filesystem::remove_all(resumed);
  std::filesystem::remove_all(ckpt);
}

TEST(TrainGptProgram, RunsAreConfiguredThroughTheRegistryConfig) {
  const auto dir = scratch("config");
  {
    std::ofstream json(dir / "adamw.json");
    json << R"({"lr": 0.007, "adam_beta2": 0.99})";
  }
  const auto out = run_program("--runs muon,adamw --print-config --set muon:muon_momentum=0.9 "
                               "--set all:weight_decay=0.05 --config adamw=" + (dir / "adamw.json").string());
  ASSERT_EQ(out.status, 0) << out.text;
  const auto muon_part = out.text.substr(0, out.text.find("run 'adamw'"));
  const auto adamw_part = out.text.substr(out.text.find("run 'adamw'"));
  EXPECT_NE(muon_part.find("\"muon_momentum\": 0.9,"), std::string::npos) << muon_part;
  EXPECT_NE(muon_part.find("\"weight_decay\": 0.05"), std::string::npos) << muon_part;
  EXPECT_NE(adamw_part.find("\"lr\": 0.007"), std::string::npos) << adamw_part;
  EXPECT_NE(adamw_part.find("\"adam_beta2\": 0.99"), std::string::npos) << adamw_part;
  EXPECT_NE(adamw_part.find("\"weight_decay\": 0.05"), std::string::npos) << adamw_part;
  // Other registered optimizers run too (lion as the scalar-free baseline).
  const auto lion = run_program(std::string(kTiny) + " --nproc 1 --steps 5 --runs lion --no-plot --out " +
                                dir.string());
  EXPECT_EQ(lion.status, 0) << lion.text;
  std::filesystem::remove_all(dir);
}

// A run may be a config file: named after the file, built from its
// `optimizer` and fields over that optimizer's preset, and addressed by
// that name in --set; a name given twice, or a missing file, is an error.
TEST(TrainGptProgram, ARunIsAConfigFile) {
  const auto dir = scratch("run_file");
  const auto file = (dir / "slow_lion.json").string();
  {
    std::ofstream json(file);
    json << R"({"optimizer": "lion", "lr": 0.0007, "lion_beta2": 0.98})";
  }
  const auto out = run_program("--runs " + file + ",adamw --print-config --set slow_lion:lion_beta1=0.8");
  ASSERT_EQ(out.status, 0) << out.text;
  ASSERT_NE(out.text.find("run 'slow_lion'"), std::string::npos) << out.text;
  const auto mine = out.text.substr(0, out.text.find("run 'adamw'"));
  EXPECT_NE(mine.find("\"optimizer\": \"lion\""), std::string::npos) << mine;
  EXPECT_NE(mine.find("\"lr\": 0.0007"), std::string::npos) << mine;
  EXPECT_NE(mine.find("\"lion_beta2\": 0.98"), std::string::npos) << mine;
  EXPECT_NE(mine.find("\"lion_beta1\": 0.8"), std::string::npos) << mine;
  EXPECT_NE(mine.find("\"lr_decay_style\": \"cosine\""), std::string::npos) << mine;  // the preset's schedule
  const auto twice = run_program("--print-config --runs " + file + "," + file);
  EXPECT_NE(twice.status, 0);
  EXPECT_NE(twice.text.find("names run 'slow_lion' twice"), std::string::npos) << twice.text;
  const auto missing = run_program("--print-config --runs " + (dir / "none.json").string());
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.text.find("none.json"), std::string::npos) << missing.text;
  // It trains like any run, its CSV named after it.
  const auto run = run_program(std::string(kTiny) + " --nproc 1 --steps 4 --no-plot --runs " + file +
                               " --out " + dir.string());
  ASSERT_EQ(run.status, 0) << run.text;
  EXPECT_TRUE(std::filesystem::exists(dir / "slow_lion.csv")) << run.text;
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, BadFlagsFailClearly) {
  const auto out = run_program("--nproc 0");
  EXPECT_NE(out.status, 0);
  EXPECT_NE(out.text.find("--nproc"), std::string::npos) << out.text;
  const auto bad_run = run_program(std::string(kTiny) + " --nproc 1 --steps 2 --runs sgdx --no-plot");
  EXPECT_NE(bad_run.status, 0);
  EXPECT_NE(bad_run.text.find("sgdx"), std::string::npos) << bad_run.text;
  // Unknown fields get a suggestion; bad values name the field and the value.
  const auto typo = run_program("--print-config --set muon:muon_momentun=0.9");
  EXPECT_NE(typo.status, 0);
  EXPECT_NE(typo.text.find("muon_momentum"), std::string::npos) << typo.text;
  const auto value = run_program("--print-config --set all:lr=fast");
  EXPECT_NE(value.status, 0);
  EXPECT_NE(value.text.find("fast"), std::string::npos) << value.text;
  const auto range = run_program("--print-config --set muon:muon_momentum=1.5");
  EXPECT_NE(range.status, 0);
  EXPECT_NE(range.text.find("1.5"), std::string::npos) << range.text;
}

// ---- bad input and ranks that disagree: one clear line, a non-zero exit ----

// The lines of `text` that are not empty.
// Lines of the program's own output. LibTorch 2.x's c10d logs its socket
// timeouts as "[W1124 05:47:01.512 socket.cpp:464] [c10d] ..." lines on
// stderr before the program sees the error; they are not the program's and
// are not counted.
size_t line_count(const std::string& text) {
  size_t n = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    auto end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const auto line = text.substr(begin, end - begin);
    const bool libtorch_log = line.size() > 2 && line[0] == '[' &&
                              (line[1] == 'W' || line[1] == 'I') && std::isdigit(line[2]) &&
                              line.find("] [c10d]") != std::string::npos;
    if (end > begin && !libtorch_log) ++n;
    begin = end + 1;
  }
  return n;
}

// Flag values the parser refuses (a choice not offered, a number out of
// range or past int64, a fraction for a count, an unknown flag): one line
// naming the flag, exit status 1, as
// every other error of the program (docs/train_gpt.md), not CLI11's codes
// and its "Run with --help" line.
TEST(TrainGptProgram, BadFlagValuesAreOneLineAndExitOne) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--parallel bogus", "--parallel"},         {"--tp 0", "--tp"},
      {"--experts 999", "--experts"},             {"--optimizer-layout x", "--optimizer-layout"},
      {"--nproc 0", "--nproc"},                   {"--no-such-flag", "--no-such-flag"},
      {"--steps " + std::string(300, '9'), "--steps"}, {"--batch 2.5", "--batch"},
      {"--save-every -1", "--save-every"},         {"--device tpu", "--device"}};
  for (const auto& [flags, name] : cases) {
    const auto out = run_program(flags);  // status: the exit status
    EXPECT_EQ(out.status, 1) << flags << ": " << out.text;
    EXPECT_EQ(line_count(out.text), 1u) << flags << ": " << out.text;
    EXPECT_NE(out.text.find(name), std::string::npos) << flags << ": " << out.text;
    EXPECT_EQ(out.text.find("Run with --help"), std::string::npos) << out.text;
    EXPECT_LE(out.text.size(), 260u) << out.text;
  }
  // --help still prints the usage and exits 0.
  const auto help = run_program("--help");
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.text.find("--parallel"), std::string::npos);
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A TCP port free at the time of the call (the kernel's choice).
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  close(s);
  return ntohs(a.sin_port);
}

// Two ranks started by hand (as a cluster's scheduler would), each with its
// own flags (and, given `cwd`, in its own working directory, as on two
// machines); their outputs and exit statuses.
std::vector<Output> run_two_ranks(const std::string& args0, const std::string& args1,
                                  const std::filesystem::path& dir,
                                  const std::vector<std::filesystem::path>& cwd = {}) {
  std::string cmd = "export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) +
                    " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2; ";
  const std::string args[] = {args0, args1};
  for (int r = 0; r < 2; ++r) {
    const auto out = (dir / ("rank" + std::to_string(r) + ".txt")).string();
    const auto status = (dir / ("status" + std::to_string(r))).string();
    cmd += "(" + (cwd.empty() ? std::string() : "cd " + cwd[static_cast<size_t>(r)].string() + " && ") +
           "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) + " " +
           MUON_TRAIN_GPT_BIN + " " + args[r] + " > " + out + " 2>&1; echo $? > " + status + ") & ";
  }
  cmd += "wait";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  std::vector<Output> outputs;
  for (int r = 0; r < 2; ++r) {
    const auto status = read_text(dir / ("status" + std::to_string(r)));
    outputs.push_back({status.empty() ? -1 : std::stoi(status),
                       read_text(dir / ("rank" + std::to_string(r) + ".txt"))});
  }
  return outputs;
}

const char* kTinyShape = "--layers 1 --heads 2 --context 32 --chars 60000 --eval-every 5 "
                         "--eval-windows 16 --no-progress --threads 1 --no-plot --runs muon ";

// The flags both ranks of a short two-rank run share: the tiny shape, 4
// steps of batch 8, the output under `dir`.
std::string two_rank_flags(const std::filesystem::path& dir) {
  return std::string(kTinyShape) + "--batch 8 --steps 4 --timeout 60 --out " + (dir / "out").string() +
         " ";
}

// --resume auto on ranks that see different --save directories (a relative
// path from two working directories, as on two machines without a shared
// file system): every rank refuses in one line naming both findings, and
// none trains from a checkpoint the others lack.
TEST(TrainGptProgram, ResumeAutoRefusesRanksThatSeeDifferentCheckpoints) {
  const auto dir = scratch("resume_auto_split");
  std::filesystem::create_directories(dir / "a");
  std::filesystem::create_directories(dir / "b");
  const std::string flags = two_rank_flags(dir) + "--width 32 ";
  ASSERT_EQ(run_program(flags + "--nproc 1 --save " + (dir / "a" / "ckpt").string()).status, 0);
  const auto out = run_two_ranks(flags + "--save ckpt --resume auto", flags + "--save ckpt --resume auto",
                                 dir, {dir / "a", dir / "b"});
  for (int r = 0; r < 2; ++r) {
    const auto& o = out[static_cast<size_t>(r)];
    EXPECT_EQ(o.status, 1) << o.text;
    EXPECT_NE(o.text.find("the newest checkpoint of run 'muon' in 'ckpt/muon' that verifies is none on rank 1, "
                          "step 4 on rank 0; --save must be one directory every rank sees"),
              std::string::npos)
        << o.text;
    EXPECT_EQ(o.text.find("resumed from"), std::string::npos) << o.text;
  }
  std::filesystem::remove_all(dir);
}

// Flips one byte inside the first chunk of the first tensor of checkpoint
// `step_dir`'s manifest: the checkpoint stays complete (its manifest is
// intact) but no longer verifies.
void damage_checkpoint(const std::filesystem::path& step_dir) {
  const auto manifest = nlohmann::json::parse(read_text(step_dir / "manifest.json"));
  const auto& chunk = manifest.at("tensors").begin().value().at("chunks").at(0);
  const auto file = step_dir / manifest.at("files").at(chunk.at("file").get<size_t>()).at("name").get<std::string>();
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << file;
  const auto at = chunk.at("offset").get<std::streamoff>() + chunk.at("bytes").get<std::streamoff>() / 2;
  f.seekg(at);
  char byte = 0;
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  f.seekp(at);
  f.write(&byte, 1);
}

// --resume auto after the newest checkpoint was damaged (a kill or a disk):
// both ranks skip it, saying which and why, continue from the one before on
// the uninterrupted curve, and the save of that step replaces the damaged
// one. --resume DIR still refuses the damaged newest checkpoint, and a
// directory where no complete checkpoint verifies is refused rather than
// trained over from step 0.
TEST(TrainGptProgram, ResumeAutoSkipsADamagedNewestCheckpoint) {
  const auto dir = scratch("resume_auto_damaged");
  const auto ckpt = dir / "ckpt";
  const std::string common = std::string(kTiny) +
                             " --nproc 2 --no-plot --runs muon --set all:lr_decay_steps=6 "
                             "--set all:lr_warmup_steps=2 --save-every 2 --keep 3 ";
  ASSERT_EQ(run_program(common + "--steps 6 --out " + (dir / "straight").string()).status, 0);
  ASSERT_EQ(run_program(common + "--steps 4 --save " + ckpt.string() + " --out " + (dir / "resumed").string()).status,
            0);
  const auto newest = ckpt / "muon" / "step-00000004";
  ASSERT_TRUE(std::filesystem::exists(newest / "manifest.json"));
  damage_checkpoint(newest);

  // --resume DIR: the damaged newest checkpoint, named, and nothing trained.
  const auto named = run_program(common + "--steps 6 --resume " + ckpt.string() + " --out " + (dir / "x").string());
  EXPECT_EQ(named.status, 1) << named.text;
  EXPECT_NE(named.text.find("checksum"), std::string::npos) << named.text;
  EXPECT_NE(named.text.find("step-00000004"), std::string::npos) << named.text;

  // Every checkpoint damaged: refused, naming the newest, and none removed.
  const auto all = dir / "all";
  std::filesystem::copy(ckpt, all, std::filesystem::copy_options::recursive);
  damage_checkpoint(all / "muon" / "step-00000002");
  const auto none = run_program(common + "--steps 6 --save " + all.string() + " --resume auto --out " +
                                (dir / "x").string());
  EXPECT_EQ(none.status, 1) << none.text;
  EXPECT_NE(none.text.find("no checkpoint in '" + (all / "muon").string() + "' verifies (the newest, " +
                           (all / "muon" / "step-00000004").string()),
            std::string::npos)
      << none.text;
  EXPECT_TRUE(std::filesystem::exists(all / "muon" / "step-00000004" / "manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(all / "muon" / "step-00000002" / "manifest.json"));

  const auto out = run_program(common + "--steps 6 --save " + ckpt.string() + " --resume auto --out " +
                               (dir / "resumed").string());
  ASSERT_EQ(out.status, 0) << out.text;
  EXPECT_NE(out.text.find("run 'muon': --resume auto: skipping the damaged checkpoint " + newest.string() + ": "),
            std::string::npos)
      << out.text;
  EXPECT_NE(out.text.find("checksum"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("run 'muon': --resume auto: continuing from step 2"), std::string::npos) << out.text;
  // Same ranks, same batches, the state of step 2: the uninterrupted curve, bit for bit.
  const auto a = train_gpt::read_csv((dir / "straight" / "muon.csv").string());
  const auto b = train_gpt::read_csv((dir / "resumed" / "muon.csv").string());
  ASSERT_EQ(a.points.size(), b.points.size());
  for (size_t i = 0; i < a.points.size(); ++i) {
    EXPECT_EQ(a.points[i].valid_loss, b.points[i].valid_loss) << "step " << a.points[i].step;
  }
  // The resumed run saved step 4 again: it verifies now.
  EXPECT_EQ(muon::distributed::verify_checkpoint(newest.string()).step, 4);
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, ResumeNamesWhatDiffersFromTheCheckpoint) {
  const auto dir = scratch("resume_mismatch");
  const auto ckpt = dir / "ckpt";
  const auto step4 = (ckpt / "muon" / "step-00000004").string();
  const std::string common = std::string(kTinyShape) + "--out " + (dir / "out").string() + " ";
  ASSERT_EQ(run_program(common + "--width 32 --batch 8 --nproc 2 --steps 4 --save " + ckpt.string()).status, 0);
  // Another world size and layout: resharded, the run continues.
  const auto one = run_program(common + "--width 32 --batch 8 --nproc 1 --steps 8 --resume " + ckpt.string());
  EXPECT_EQ(one.status, 0) << one.text;
  EXPECT_NE(one.text.find("resumed from step 4 of " + step4 +
                          " (written by 2 ranks, layer-wise; this run: 1 rank, single process)"),
            std::string::npos)
      << one.text;
  // Another model shape: the flag and both values, on every rank.
  const auto wider = run_program(common + "--width 64 --batch 8 --nproc 2 --steps 8 --resume " + ckpt.string());
  EXPECT_NE(wider.status, 0);
  EXPECT_NE(wider.text.find("checkpoint " + step4 +
                            " was written with --width 32, this run has --width 64"),
            std::string::npos)
      << wider.text;
  EXPECT_EQ(wider.text.find("step 5/8"), std::string::npos) << wider.text;
  // Another vocabulary: the flags that set it.
  const auto bytes = run_program(
      common + "--width 32 --batch 8 --nproc 1 --steps 8 --byte-level --resume " + ckpt.string());
  EXPECT_NE(bytes.status, 0);
  EXPECT_NE(bytes.text.find(" tokens, this run has 256 (the data: --data, --chars, --byte-level)"),
            std::string::npos)
      << bytes.text;
  // A run the checkpoint directory does not have: named before any rank
  // starts (before the run that has one trains).
  auto both = common;
  both.replace(both.find("--runs muon"), 11, "--runs muon,adamw");
  const auto other =
      run_program(both + "--width 32 --batch 8 --nproc 2 --steps 8 --resume " + ckpt.string());
  EXPECT_EQ(other.status, 1) << other.text;
  EXPECT_NE(
      other.text.find("--resume '" + ckpt.string() + "': no complete checkpoint of run 'adamw'"),
      std::string::npos)
      << other.text;
  EXPECT_EQ(line_count(other.text), 1u) << other.text;
  std::filesystem::remove_all(dir);
}

// The CSV rows of a run's log, as text (the columns compared exactly).
std::vector<std::string> csv_rows(const std::filesystem::path& path) {
  std::vector<std::string> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) rows.push_back(line);
  return rows;
}

TEST(TrainGptProgram, SaveEveryKeepsTheNewestCheckpoints) {
  const auto dir = scratch("save_every");
  const auto out = run_program(std::string(kTiny) +
                               " --nproc 1 --steps 9 --runs muon --no-plot --save-every 2 "
                               "--keep 2 --save " +
                               (dir / "ckpt").string() + " --out " + (dir / "out").string());
  ASSERT_EQ(out.status, 0) << out.text;
  // Saved at 2, 4, 6, 8 and the last step, 9; the two newest are kept, and
  // nothing else (no temporary or unfinished file).
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir / "ckpt" / "muon")) {
    names.push_back(e.path().filename().string());
    EXPECT_TRUE(std::filesystem::exists(e.path() / "manifest.json")) << e.path();
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000008", "step-00000009"}));
  // Nothing but the run's directory in --save.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir / "ckpt"),
                          std::filesystem::directory_iterator()),
            1);
  // The flags are in --help.
  const auto help = run_program("--help");
  EXPECT_EQ(help.status, 0);
  for (const auto* flag : {"--save ", "--save-every", "--keep", "--resume"}) {
    EXPECT_NE(help.text.find(flag), std::string::npos) << flag << "\n" << help.text;
  }
  std::filesystem::remove_all(dir);
}

// `resumed`'s CSV starts with the rows of `checkpoint`'s (the checkpoint's
// log, exactly), has as many rows as `straight`'s, and its later validation
// and training losses are within `tolerance` (relative) of `straight`'s.
void expect_continues(const std::filesystem::path& checkpoint, const std::filesystem::path& resumed,
                      const std::filesystem::path& straight, double tolerance,
                      const std::string& what) {
  const auto saved = csv_rows(checkpoint);
  const auto rows = csv_rows(resumed);
  ASSERT_GE(saved.size(), 2u) << what;
  ASSERT_GE(rows.size(), saved.size()) << what;
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(rows[i], saved[i]) << what << " row " << i;
  const auto a = train_gpt::read_csv(straight.string());
  const auto b = train_gpt::read_csv(resumed.string());
  ASSERT_EQ(a.points.size(), b.points.size()) << what;
  for (size_t i = saved.size() - 1; i < a.points.size(); ++i) {
    EXPECT_EQ(a.points[i].step, b.points[i].step) << what;
    EXPECT_EQ(a.points[i].tokens, b.points[i].tokens) << what;
    EXPECT_NEAR(b.points[i].valid_loss, a.points[i].valid_loss, tolerance * a.points[i].valid_loss)
        << what << " step " << a.points[i].step;
    EXPECT_NEAR(b.points[i].train_loss, a.points[i].train_loss, tolerance * a.points[i].train_loss)
        << what << " step " << a.points[i].step;
  }
}

// The relative tolerance of a run resumed at another world size or layout
// against an uninterrupted one. The two differ only in float rounding in
// the first 10 steps (the gradient is a mean of per-rank batch means, and
// each rank's BLAS sums in its own order), and the resumed steps start from
// the same values: measured over these 20 steps, the largest relative
// difference of a training or validation loss is 7.8e-8 (2 ranks → 1),
// 5.3e-8 (2 → 3) and 0 (replicated → layer-wise, 2 ranks). 1e-5 leaves two
// orders of magnitude for another BLAS or LibTorch, and still fails a
// resume that is off by little: noise of standard deviation 1e-4 added to
// every parameter at the resume moves the losses by 5e-5 relative.
constexpr double kReshardTolerance = 1e-5;

TEST(TrainGptProgram, ResumeAtAnotherWorldSize) {
  const auto dir = scratch("reshard_world");
  // --batch 6: a multiple of 1, 2 and 3 ranks, so every run trains on the
  // same global batches.
  const std::string common =
      std::string(kTinyShape) +
      "--width 32 --batch 6 --set all:lr_decay_steps=20 --set all:lr_warmup_steps=2 ";
  auto out_of = [&](const std::string& name) { return (dir / name).string(); };
  const auto saved = run_program(common + "--nproc 2 --steps 10 --save " + out_of("ckpt") +
                                 " --out " + out_of("saved"));
  ASSERT_EQ(saved.status, 0) << saved.text;
  for (const int nproc : {1, 3}) {
    const auto n = std::to_string(nproc);
    const auto straight =
        run_program(common + "--nproc " + n + " --steps 20 --out " + out_of("straight" + n));
    ASSERT_EQ(straight.status, 0) << straight.text;
    const auto resumed = run_program(common + "--nproc " + n + " --steps 20 --resume " +
                                     out_of("ckpt") + " --out " + out_of("resumed" + n));
    ASSERT_EQ(resumed.status, 0) << resumed.text;
    EXPECT_NE(resumed.text.find("resumed from step 10 of "), std::string::npos) << resumed.text;
    EXPECT_NE(resumed.text.find(
                  "(written by 2 ranks, layer-wise; this run: " +
                  std::string(nproc == 1 ? "1 rank, single process)" : "3 ranks, layer-wise)")),
              std::string::npos)
        << resumed.text;
    // The loaded model is the saved one: its validation loss at the
    // checkpoint's step, evaluated again at another world size.
    const std::string prefix = "run 'muon': val loss at step 10: ";
    const auto at = resumed.text.find(prefix);
    ASSERT_NE(at, std::string::npos) << resumed.text;
    double logged = 0;
    double again = 0;
    ASSERT_EQ(std::sscanf(resumed.text.c_str() + at + prefix.size(),
                          "%lf in the checkpoint's log, %lf evaluated after loading", &logged, &again),
              2)
        << resumed.text;
    EXPECT_LE(std::abs(again - logged), kReshardTolerance * logged) << resumed.text;
    expect_continues(dir / "saved" / "muon.csv", dir / ("resumed" + n) / "muon.csv",
                     dir / ("straight" + n) / "muon.csv", kReshardTolerance, "--nproc " + n);
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, ResumeReplicatedCheckpointLayerWise) {
  const auto dir = scratch("reshard_layout");
  const std::string common = std::string(kTinyShape) +
                             "--width 32 --batch 8 --nproc 2 --set all:lr_decay_steps=20 "
                             "--set all:lr_warmup_steps=2 ";
  auto out_of = [&](const std::string& name) { return (dir / name).string(); };
  const auto saved = run_program(common + "--optimizer-layout replicated --steps 10 --save " +
                                 out_of("ckpt") + " --out " + out_of("saved"));
  ASSERT_EQ(saved.status, 0) << saved.text;
  const auto straight = run_program(common + "--steps 20 --out " + out_of("straight"));
  ASSERT_EQ(straight.status, 0) << straight.text;
  const auto resumed =
      run_program(common + "--steps 20 --resume " + out_of("ckpt") + " --out " + out_of("resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.text;
  EXPECT_NE(resumed.text.find("(written by 2 ranks, replicated; this run: 2 ranks, layer-wise)"),
            std::string::npos)
      << resumed.text;
  expect_continues(dir / "saved" / "muon.csv", dir / "resumed" / "muon.csv",
                   dir / "straight" / "muon.csv", kReshardTolerance, "replicated to layer-wise");
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, PathsThatCannotBeDirectoriesFailInOneLine) {
  const auto dir = scratch("bad_paths");
  const auto file = dir / "a_file";
  std::ofstream(file) << "x";
  for (const std::string flag : {"--out", "--save"}) {
    const auto target = (file / "sub").string();
    const auto out = run_program(std::string(kTiny) + " --nproc 1 --steps 2 --no-plot " + flag + " " + target +
                                 (flag == "--save" ? " --out " + (dir / "out").string() : ""));
    EXPECT_EQ(out.status, 1) << out.text;
    EXPECT_NE(out.text.find(flag + " '" + target + "': cannot create " +
                            (flag == "--save" ? "the checkpoint directory" : "this directory")),
              std::string::npos)
        << out.text;
    EXPECT_EQ(line_count(out.text), 1u) << out.text;
  }
  // Nothing was written under it, and the file is untouched.
  EXPECT_EQ(read_text(file), "x");
  // A directory given as --config: one line naming the flag.
  const auto config = run_program("--print-config --config " + dir.string());
  EXPECT_EQ(config.status, 1) << config.text;
  EXPECT_NE(config.text.find("--config '" + dir.string() + "' is a directory"), std::string::npos)
      << config.text;
  EXPECT_EQ(line_count(config.text), 1u) << config.text;
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, UnwritableSaveFailsBeforeTraining) {
  // As root, permission bits do not stop a write; a path under a regular
  // file, or in /proc, cannot hold checkpoints for anyone.
  const auto dir = scratch("unwritable_save");
  const auto file = dir / "a_file";
  std::ofstream(file) << "x";
  for (const std::string& target :
       {(file / "ckpt").string(), std::string("/proc/1/ckpt"), std::string("/proc/1")}) {
    const auto t0 = std::chrono::steady_clock::now();
    // Two ranks: found before the launcher starts them. With the progress
    // bar on, a step taken would print "step N/2000".
    const auto out = run_program(
        "--layers 1 --width 32 --heads 2 --context 32 --batch 8 --chars 60000 "
        "--eval-windows 16 --threads 1 --nproc 2 --steps 2000 --no-plot "
        "--save-every 10 --save " +
        target + " --out " + (dir / "out").string());
    const auto seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(out.status, 1) << out.text;
    EXPECT_NE(out.text.find("--save '" + target + "': "), std::string::npos) << out.text;
    EXPECT_EQ(line_count(out.text), 1u) << out.text;
    EXPECT_EQ(out.text.find("step"), std::string::npos) << out.text;
    EXPECT_EQ(out.text.find("[rank"), std::string::npos) << out.text;
    // A program start (0.5 s here), not 2000 steps of two runs (40 s here).
    EXPECT_LT(seconds, 5.0) << out.text;
  }
  EXPECT_EQ(read_text(file), "x");
  EXPECT_TRUE(std::filesystem::is_empty(dir / "out"));
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, RanksStartedWithOtherFlagsFailOnEveryRank) {
  const auto dir = scratch("rank_flags");
  const std::string common = two_rank_flags(dir);
  const auto outs = run_two_ranks(common + "--width 32", common + "--width 16", dir);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(outs[static_cast<size_t>(r)].status, 1) << outs[static_cast<size_t>(r)].text;
    EXPECT_NE(outs[static_cast<size_t>(r)].text.find("--width is 16 on rank 1, 32 on rank 0"),
              std::string::npos)
        << outs[static_cast<size_t>(r)].text;
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, AnotherSeedOnOneRankTrainsRankZerosModel) {
  // Rank 0's initialization is broadcast before the optimizer is built (as
  // DDP does); without it the layer-wise optimizer refuses parameters whose
  // values differ between the ranks.
  const auto dir = scratch("rank_seeds");
  const std::string common = two_rank_flags(dir) + "--width 32 ";
  const auto outs = run_two_ranks(common + "--seed 1", common + "--seed 2", dir);
  for (const auto& out : outs) EXPECT_EQ(out.status, 0) << out.text;
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, TensorParallelRanksShareTheFirstRanksSeed) {
  // The two ranks of a tensor-parallel group compute one model on one batch:
  // started with different seeds, both take rank 0's, and the run is the
  // single-process run of seed 1 (a rank drawing its own batches would mix
  // two batches into every activation).
  const auto dir = scratch("tp_seeds");
  const std::string common = std::string(kTinyShape) +
                             "--width 32 --batch 8 --steps 10 --timeout 60 ";
  const auto outs = run_two_ranks(common + "--parallel tp --seed 1 --out " + (dir / "tp").string(),
                                  common + "--parallel tp --seed 2 --out " + (dir / "tp").string(), dir);
  for (const auto& out : outs) ASSERT_EQ(out.status, 0) << out.text;
  ASSERT_EQ(run_program(common + "--nproc 1 --seed 1 --out " + (dir / "one").string()).status, 0);
  const auto tp = train_gpt::read_csv((dir / "tp" / "muon.csv").string());
  const auto one = train_gpt::read_csv((dir / "one" / "muon.csv").string());
  ASSERT_EQ(tp.points.size(), one.points.size());
  for (size_t i = 0; i < tp.points.size(); ++i) {
    // Float rounding only (tests/test_train_gpt_layouts.cpp: within 1e-4).
    EXPECT_NEAR(tp.points[i].valid_loss, one.points[i].valid_loss, 1e-4 * one.points[i].valid_loss)
        << "step " << one.points[i].step;
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainGptProgram, TimeoutFlagBoundsTheWaitForMissingRanks) {
  // Rank 1 of 2 never starts: rank 0 gives up after --timeout seconds with
  // one line instead of waiting the default 300 s.
  const auto dir = scratch("timeout");
  const std::string cmd = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) +
                          " WORLD_SIZE=2 RANK=0 " + MUON_TRAIN_GPT_BIN + " " + kTinyShape +
                          "--width 32 --batch 8 --steps 2 --timeout 2 --out " + (dir / "out").string();
  const auto out = run_program_command(cmd);
  EXPECT_EQ(out.status, 1) << out.text;
  EXPECT_NE(out.text.find("waited 2 s"), std::string::npos) << out.text;
  EXPECT_EQ(line_count(out.text), 1u) << out.text;
  std::filesystem::remove_all(dir);
}

// ---- --device: cpu, or one CUDA device per rank ----

// The message of a refused --device: one line, exit status 1, naming the
// flag and its value, before any process starts or any rank waits.
void expect_device_refused(const Output& out, const std::string& value, const std::string& why) {
  EXPECT_EQ(out.status, 1) << out.text;
  EXPECT_EQ(line_count(out.text), 1u) << out.text;
  EXPECT_NE(out.text.find("--device " + value + ": " + why), std::string::npos) << out.text;
  EXPECT_EQ(out.text.find("rank(s)"), std::string::npos) << "it trained: " << out.text;
  EXPECT_EQ(out.text.find("muon-launch"), std::string::npos) << "it started ranks: " << out.text;
}

// Without a GPU (a LibTorch without CUDA, or one that sees no device),
// --device cuda is refused at the command line: the launcher is never
// started, and a rank under a launcher stops before its rendezvous (rank 0
// of 2 would otherwise host the store and wait --timeout for rank 1).
TEST(TrainGptProgram, DeviceCudaWithoutAGpuIsRefusedInOneLine) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is available here";
  const auto dir = scratch("device_cuda");
  const std::string flags = std::string(kTiny) + " --steps 2 --no-plot --device cuda --out " +
                            (dir / "out").string();
  const std::string why = "no CUDA device is available (this LibTorch has CUDA: ";
  expect_device_refused(run_program(flags + " --nproc 2"), "cuda", why);
  expect_device_refused(run_program(flags + " --nproc 1"), "cuda", why);
  expect_device_refused(run_program("--print-config --device cuda"), "cuda", why);
  const auto t0 = std::chrono::steady_clock::now();
  const auto launched = run_program_command(
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) +
      " WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 " + MUON_TRAIN_GPT_BIN + " " + flags + " --timeout 120");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_device_refused(launched, "cuda", why);
  EXPECT_LT(seconds, 60) << "rank 0 waited for rank 1: " << launched.text;
  std::filesystem::remove_all(dir);
}

// A value that is no device is refused the same way, GPU or not.
TEST(TrainGptProgram, DeviceValueNotOfferedIsRefusedInOneLine) {
  const std::string why = "not a device of this program; give cpu or cuda";
  expect_device_refused(run_program(std::string(kTiny) + " --steps 2 --device tpu"), "tpu", why);
  expect_device_refused(run_program("--device CUDA --nproc 1"), "CUDA", why);
  expect_device_refused(run_program("--device cuda:1 --nproc 1"), "cuda:1", why);
}

// --preset kjv: the width-384 GPT on the King James Bible, the corpus the
// build writes beside the program from Debian's bible-kjv, through the
// job's --data path. A few steps on 2 ranks; --steps and --eval-every
// given on the command line win over the preset's.
TEST(TrainGptProgram, KjvPresetTrainsTheWideGptOnTheBible) {
  const auto corpus = std::filesystem::path(MUON_TRAIN_GPT_BIN).parent_path() / "kjv.txt";
  ASSERT_TRUE(std::filesystem::exists(corpus)) << corpus << ": scripts/setup.sh installs bible-kjv";
  std::vector<std::string> verses;
  {
    std::ifstream in(corpus);
    for (std::string line; std::getline(in, line);) verses.push_back(line);
  }
  ASSERT_EQ(verses.size(), 31102u);  // the verses of the King James Bible
  EXPECT_EQ(verses.front(), "In the beginning God created the heaven and the earth.");
  EXPECT_EQ(verses.back(), "The grace of our Lord Jesus Christ be with you all. Amen.");

  const auto dir = scratch("kjv");
  const auto out = run_program("--preset kjv --nproc 2 --steps 2 --eval-every 1 --eval-windows 4 "
                               "--runs muon --no-progress --no-plot --threads 1 --out " +
                               dir.string());
  ASSERT_EQ(out.status, 0) << out.text;
  // The model of the preset over the corpus's characters, and its split:
  // the first 90% trains, the rest validates (make_dataset's rule).
  const auto text_size = static_cast<int64_t>(std::filesystem::file_size(corpus));
  const auto n_train = static_cast<int64_t>(static_cast<double>(text_size) * (1 - 0.1));
  train_gpt::GptConfig c;
  c.vocab_size = 63;  // the distinct characters of the corpus, newline included
  c.layers = 6;
  c.width = 384;
  c.heads = 6;
  c.context = 256;
  const auto params = train_gpt::Gpt(c)->num_parameters();
  const auto expected = "muon-train-gpt: 2 rank(s) on cpu, " + std::to_string(params) + " parameters, vocab 63, " +
                        std::to_string(n_train) + " train / " + std::to_string(text_size - n_train) +
                        " valid tokens";
  EXPECT_NE(out.text.find(expected), std::string::npos) << expected << "\n" << out.text;
  const auto log = train_gpt::read_csv((dir / "muon.csv").string());
  ASSERT_EQ(log.points.size(), 3u);  // steps 0, 1, 2
  EXPECT_TRUE(std::isfinite(log.final_point().valid_loss));
  EXPECT_LT(log.final_point().valid_loss, log.points[0].valid_loss);
  std::filesystem::remove_all(dir);
}

// Without its corpus, --preset kjv stops in one line naming the package.
TEST(TrainGptProgram, KjvPresetWithoutItsCorpusNamesThePackage) {
  const auto out = run_program_command("MUON_KJV_CORPUS=/nonexistent/kjv.txt " + std::string(MUON_TRAIN_GPT_BIN) +
                                       " --preset kjv --nproc 1 --steps 1 --no-plot");
  EXPECT_EQ(out.status, 1) << out.text;
  EXPECT_EQ(std::count(out.text.begin(), out.text.end(), '\n'), 1) << out.text;
  EXPECT_NE(out.text.find("--preset kjv: no corpus at '/nonexistent/kjv.txt'; install Debian's bible-kjv"),
            std::string::npos)
      << out.text;
  const auto bad = run_program("--preset large --nproc 1");
  EXPECT_EQ(bad.status, 1) << bad.text;
  EXPECT_NE(bad.text.find("--preset"), std::string::npos) << bad.text;
}

// --preset kjv's learning rates are the ones its sweep chose
// (docs/train_gpt.md, "At width 384"): AdamW at 5e-4, Muon at 0.02 with
// its AdamW part at AdamW's 5e-4, adaptive_muon at 0.04, SOAP at 1e-3, an
// entry not swept there at its default-task lr; without the preset the
// default task's (4e-3 for both AdamWs), and --set still wins over either.
TEST(TrainGptProgram, KjvPresetRunsAtItsSweptLearningRates) {
  // --print-config prints each run as "run 'NAME':" and its config as JSON.
  const auto config_of = [](const std::string& text, const std::string& run) {
    const auto begin = text.find('{', text.find("run '" + run + "':"));
    return nlohmann::json::parse(text.substr(begin, text.find("\nrun '", begin) - begin));
  };
  const auto lr_of = [&](const std::string& text, const std::string& run) {
    return config_of(text, run).at("lr").get<double>();
  };
  const auto override_lr = [&](const std::string& text) {
    const auto rules = config_of(text, "muon").at("overrides");
    const auto rule = std::find_if(rules.begin(), rules.end(), [](const auto& r) { return r.at("label") == "adamw lr"; });
    return rule == rules.end() ? -1.0 : rule->at("set").at("lr").get<double>();
  };
  // Each run's lr under --preset kjv and without it; lion is not swept at
  // width 384, so it keeps its default-task lr there.
  const std::vector<std::tuple<std::string, double, double>> rates{
      {"adamw", 5e-4, 4e-3}, {"muon", 0.02, 0.02}, {"adaptive_muon", 0.04, 0.02}, {"soap", 1e-3, 4e-3},
      {"lion", 6e-4, 6e-4}};
  const auto kjv = run_program("--preset kjv --print-config --runs muon,adaptive_muon,soap,adamw,lion");
  const auto small = run_program("--print-config --runs muon,adaptive_muon,soap,adamw,lion");
  ASSERT_EQ(kjv.status, 0) << kjv.text;
  ASSERT_EQ(small.status, 0) << small.text;
  for (const auto& [run, at_kjv, at_small] : rates) {
    EXPECT_EQ(lr_of(kjv.text, run), at_kjv) << run << "\n" << kjv.text;
    EXPECT_EQ(lr_of(small.text, run), at_small) << run << "\n" << small.text;
  }
  EXPECT_EQ(override_lr(kjv.text), 5e-4) << kjv.text;
  const auto set = run_program("--preset kjv --print-config --runs adamw --set adamw:lr=0.0123");
  ASSERT_EQ(set.status, 0) << set.text;
  EXPECT_EQ(lr_of(set.text, "adamw"), 0.0123) << set.text;
}

// --device cpu (the default) is recorded where a run reports: the first
// line, the table and the --summary JSON.
TEST(TrainGptProgram, DeviceIsRecordedInTheLogTableAndSummary) {
  const auto dir = scratch("device_cpu");
  const auto summary = dir / "summary.json";
  const auto out = run_program(std::string(kTiny) + " --nproc 1 --steps 2 --no-plot --runs adamw " +
                               "--device cpu --out " + (dir / "out").string() + " --summary " +
                               summary.string());
  ASSERT_EQ(out.status, 0) << out.text;
  EXPECT_NE(out.text.find("muon-train-gpt: 1 rank(s) on cpu, "), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("\ndevice: cpu\n"), std::string::npos) << out.text;
  std::ifstream in(summary);
  EXPECT_EQ(nlohmann::json::parse(in).at("device"), "cpu");
  std::filesystem::remove_all(dir);
}

// A checkpoint's manifest says where its run computed; one written before
// --device (no "device" field) still reads, with device "".
TEST(TrainGptCheckpointRun, DeviceRoundTripsAndMayBeAbsent) {
  train_gpt::CheckpointRun run;
  run.layout = "single process";
  run.world = 1;
  run.device = "cuda:0";
  run.points.push_back({0, 0, std::numeric_limits<double>::quiet_NaN(), 3.5, 0, 0});
  const auto text = train_gpt::run_to_json(run);
  EXPECT_EQ(train_gpt::run_from_json(text, "p").device, "cuda:0");
  auto j = nlohmann::json::parse(text);
  j.erase("device");
  const auto old = train_gpt::run_from_json(j.dump(), "p");
  EXPECT_EQ(old.device, "");
  EXPECT_EQ(old.points.size(), 1u);
}

// The first loss in `text` that follows `marker`.
double number_after(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  EXPECT_NE(at, std::string::npos) << marker << " not in: " << text;
  return at == std::string::npos ? NAN : std::stod(text.substr(at + marker.size()));
}

// On a GPU: the same runs on CUDA and on the CPU give the same losses up to
// float rounding, and checkpoints move between the devices both ways.
//
// Tolerance: a relative 1e-3. Both devices start from the same weights (the
// model is initialized on the CPU and moved) and train on the same batches
// in fp32 (TF32 is off in LibTorch's matmuls by default, and muon's kernels
// never use it; Newton–Schulz computes in fp32). They differ only in the
// order of fp32 sums: a dot product of k ≤ 128 terms (width 32, MLP 128,
// vocab 46) differs by at most γ_k ≈ k·2⁻²⁴ ≈ 8e-6 relative, typically
// √k·2⁻²⁴ ≈ 7e-7. Ten steps (or five on each device across a checkpoint)
// through forward, backward, Adam's division by √v and Newton–Schulz's five
// iterations (each amplifying a perturbation at most ~3.4×, its
// polynomial's slope at 0) leave the loss within ~1e-5 of the CPU's; 1e-3
// is 100× that margin. A device bug (batches, state or
// weights not moved, another initialization) shows as ≥ 1e-2: one step at
// these learning rates moves the loss (≈ 3.7 nats) by 0.05–0.1 nats.
TEST(TrainGptProgram, DeviceCudaMatchesTheCpuAndCheckpointsMoveBothWays) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  constexpr double kTolerance = 1e-3;
  const auto dir = scratch("device_both");
  // The schedule fixed in the config, so that a run continued to 10 steps
  // follows the one that ran 10 steps straight.
  // kTiny's model and batch, a log point at every step.
  const std::string common =
      "--layers 1 --width 32 --heads 2 --context 32 --batch 8 --chars 60000 --eval-every 1 "
      "--eval-windows 16 --no-progress --threads 1 --no-plot --runs muon,adamw "
      "--set all:lr_decay_steps=10 --set all:lr_warmup_steps=1 ";
  auto run = [&](const std::string& name, const std::string& flags) {
    const auto out = run_program(common + flags + " --out " + (dir / name).string());
    EXPECT_EQ(out.status, 0) << name << ": " << out.text;
    return out.text;
  };
  auto expect_near_logs = [&](const std::string& a, const std::string& b, const char* what) {
    for (const std::string r : {"muon", "adamw"}) {
      const auto x = train_gpt::read_csv((dir / a / (r + ".csv")).string());
      const auto y = train_gpt::read_csv((dir / b / (r + ".csv")).string());
      ASSERT_EQ(x.points.size(), y.points.size()) << what << " " << r;
      for (size_t i = 0; i < x.points.size(); ++i) {
        const auto& p = x.points[i];
        EXPECT_NEAR(p.valid_loss, y.points[i].valid_loss, kTolerance * p.valid_loss)
            << what << " " << r << " step " << p.step;
        if (i > 0) {
          EXPECT_NEAR(p.train_loss, y.points[i].train_loss, kTolerance * p.train_loss)
              << what << " " << r << " step " << p.step;
        }
      }
    }
  };
  const auto cpu = run("cpu", "--nproc 1 --steps 10 --device cpu");
  const auto cuda = run("cuda", "--nproc 1 --steps 10 --device cuda");
  EXPECT_NE(cuda.find("1 rank(s) on cuda:0"), std::string::npos) << cuda;
  EXPECT_NE(cuda.find("\ndevice: cuda:0"), std::string::npos) << cuda;
  expect_near_logs("cpu", "cuda", "cpu against cuda");

  // 5 steps on CUDA, continued on the CPU: the checkpoint's CPU tensors load
  // onto the CPU, and the model evaluates as it did on the GPU.
  run("cuda5", "--nproc 1 --steps 5 --device cuda --save " + (dir / "ckpt_cuda").string());
  const auto on_cpu =
      run("cuda5_cpu", "--nproc 1 --steps 10 --device cpu --resume " + (dir / "ckpt_cuda").string());
  EXPECT_NE(on_cpu.find("(written by 1 rank, single process, on cuda:0; this run: 1 rank, single "
                        "process, on cpu)"),
            std::string::npos)
      << on_cpu;
  const double logged = number_after(on_cpu, "run 'muon': val loss at step 5: ");
  const double again = number_after(on_cpu, " in the checkpoint's log, ");
  EXPECT_NEAR(logged, again, kTolerance * logged) << on_cpu;
  expect_near_logs("cpu", "cuda5_cpu", "cuda then cpu");

  // And back: 5 steps on the CPU, continued on CUDA.
  run("cpu5", "--nproc 1 --steps 5 --device cpu --save " + (dir / "ckpt_cpu").string());
  const auto on_cuda =
      run("cpu5_cuda", "--nproc 1 --steps 10 --device cuda --resume " + (dir / "ckpt_cpu").string());
  EXPECT_NE(on_cuda.find("on cpu; this run: 1 rank, single process, on cuda:0)"), std::string::npos)
      << on_cuda;
  expect_near_logs("cpu", "cpu5_cuda", "cpu then cuda");

  if (torch::cuda::device_count() >= 2) {
    // Two ranks, one GPU each, over NCCL, against two ranks on the CPU.
    run("cpu2", "--steps 10 --device cpu --nproc 2");
    const auto two = run("cuda2", "--steps 10 --device cuda --nproc 2");
    EXPECT_NE(two.find("2 rank(s) on cuda:<LOCAL_RANK>, rank 0's cuda:0"), std::string::npos)
        << two;
    expect_near_logs("cpu2", "cuda2", "two ranks, cpu against cuda");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
