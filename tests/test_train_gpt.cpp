// The train_gpt example's pieces: corpus, vocabulary, batches, model,
// logs and table, checkpoint resume.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "data.h"
#include "gpt.h"
#include "muon/optim/hybrid.h"
#include "report.h"
#include "trainer.h"

namespace {

// A fresh directory under the system temp dir, unique to this process (test
// programs may run concurrently).
std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("muon_train_gpt_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

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

TEST(TrainGptModel, ShapesNamesAndCausality) {
  train_gpt::GptConfig c;
  c.vocab_size = 11;
  c.context = 8;
  c.layers = 2;
  c.width = 16;
  c.heads = 2;
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

RunLog make_log(std::vector<std::pair<int64_t, double>> points) {
  RunLog log{"x", {}};
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
  const auto table = train_gpt::comparison_table({a, b}, 1);
  EXPECT_NE(table.find("10 (0.50x)"), std::string::npos) << table;
  EXPECT_NE(table.find("20 (1.00x)"), std::string::npos) << table;
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

  auto first = o;
  first.steps = 6;
  first.save_checkpoint = (dir / "ckpt").string();
  train_gpt::train(data, first, make_hybrid, {});
  auto second = o;
  second.resume = first.save_checkpoint;
  const auto resumed = train_gpt::train(data, second, make_hybrid, {});
  ASSERT_EQ(resumed.points.size(), straight.points.size());
  for (size_t i = 0; i < straight.points.size(); ++i) {
    EXPECT_EQ(resumed.points[i].step, straight.points[i].step);
    // Same batches, same state: bit-identical losses.
    EXPECT_EQ(resumed.points[i].valid_loss, straight.points[i].valid_loss) << i;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

// ---- the program, as a user runs it: real processes through muon-launch ----

namespace {

struct Output {
  int status;
  std::string text;
};

Output run_program(const std::string& args) {
  const std::string cmd = std::string(MUON_TRAIN_GPT_BIN) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string text;
  char buf[4096];
  while (pipe != nullptr && fgets(buf, sizeof buf, pipe) != nullptr) text += buf;
  const int status = pipe != nullptr ? pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

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

TEST(TrainGptProgram, RunsUnderTorchrun) {
  if (!std::filesystem::exists("/usr/bin/torchrun")) GTEST_SKIP() << "torchrun is not installed";
  const auto dir = scratch("torchrun");
  // Debian's torchrun (PyTorch 1.13) spells the flag --no_python, and on
  // Python 3.11 needs explicit per-rank --redirects/--tee maps.
  const std::string cmd = "/usr/bin/torchrun --no_python --standalone --nproc_per_node 2 "
                          "--redirects 0:1,1:1 --tee 0:1,1:1 --log_dir " + (dir / "logs").string() +
                          " " + MUON_TRAIN_GPT_BIN + " " + kTiny + " --steps 10 --no-plot --out " +
                          (dir / "out").string() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe) != nullptr) text += buf;
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
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
  EXPECT_TRUE(std::filesystem::exists(ckpt / "muon.ckpt.rank0"));
  EXPECT_TRUE(std::filesystem::exists(ckpt / "muon.ckpt.rank1"));
  const auto out = run_program(common + "--steps 20 --resume " + ckpt.string() + " --out " + resumed.string());
  ASSERT_EQ(out.status, 0) << out.text;
  const auto a = train_gpt::read_csv((straight / "muon.csv").string());
  const auto b = train_gpt::read_csv((resumed / "muon.csv").string());
  ASSERT_EQ(a.points.size(), b.points.size());
  for (size_t i = 0; i < a.points.size(); ++i) {
    // Same ranks, same batches, restored state: bit-identical losses.
    EXPECT_EQ(a.points[i].valid_loss, b.points[i].valid_loss) << "step " << a.points[i].step;
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

}  // namespace
