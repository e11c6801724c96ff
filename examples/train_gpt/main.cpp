// muon-train-gpt: trains a small GPT with Muon (hybrid: AdamW for embeddings,
// head, norms and biases) and with AdamW alone, at the same seed and token
// budget, data-parallel over local processes, and compares them.
//
//   muon-train-gpt                     # defaults: 2 ranks, muon vs adamw
//   muon-train-gpt --nproc 1 --steps 200 --runs muon
//   torchrun --no_python --nproc_per_node 2 muon-train-gpt
//
// With --nproc N > 1 and no launcher around it, it starts N ranks of itself
// through muon-launch. With more than one rank the gradients are averaged
// and the optimizer runs layer-wise distributed (each rank updates its share
// of the parameters and all-gathers them).
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data.h"
#include "gpt.h"
#include "muon/dist/group.h"
#include "muon/dist/layerwise.h"
#include "muon/optim/hybrid.h"
#include "report.h"
#include "trainer.h"

namespace fs = std::filesystem;

namespace {

struct Flags {
  train_gpt::TrainOptions train;
  int64_t nproc = 2;
  int64_t threads = 0;  // per rank; 0: cores / ranks
  int64_t chars = 2'000'000;
  std::string data_file;
  bool byte_level = false;
  std::string runs = "muon,adamw";
  std::string out = "train_gpt_out";
  std::string save;
  std::string resume;
  bool plot = true;
  std::string layout = "layerwise";
  // Optimizer settings.
  double lr = 3e-3;
  double muon_lr = 0.02;
  double weight_decay = 0.0;
};

fs::path self_dir() { return fs::canonical("/proc/self/exe").parent_path(); }

// muon-launch: $MUON_LAUNCH, next to this program, the build tree, or PATH.
std::string find_launcher() {
  if (const char* env = std::getenv("MUON_LAUNCH")) return env;
  const auto beside = self_dir() / "muon-launch";
  if (fs::exists(beside)) return beside.string();
#ifdef MUON_LAUNCH_BUILD_PATH
  if (fs::exists(MUON_LAUNCH_BUILD_PATH)) return MUON_LAUNCH_BUILD_PATH;
#endif
  return "muon-launch";
}

// The plot script: next to this program (installed), or in the source tree.
std::string find_plot_script() {
  for (const auto& p : {self_dir() / "muon-plot-runs", self_dir() / "../share/muon/plot_runs.py"}) {
    if (fs::exists(p)) return p.string();
  }
#ifdef MUON_PLOT_SCRIPT_SOURCE
  if (fs::exists(MUON_PLOT_SCRIPT_SOURCE)) return MUON_PLOT_SCRIPT_SOURCE;
#endif
  return "";
}

std::unique_ptr<torch::optim::Optimizer> make_local_optimizer(
    const std::string& run, const torch::OrderedDict<std::string, at::Tensor>& params, const Flags& f) {
  if (run == "muon") {
    muon::MuonWithAdamWOptions o;
    o.muon(muon::MuonOptions(f.muon_lr).weight_decay(f.weight_decay));
    o.adamw(torch::optim::AdamWOptions(f.lr).betas({0.9, 0.95}).weight_decay(f.weight_decay));
    return std::make_unique<muon::MuonWithAdamW>(params, o);
  }
  TORCH_CHECK_VALUE(run == "adamw", "[muon-train-gpt] unknown run '", run, "'; valid: muon, adamw");
  return std::make_unique<torch::optim::AdamW>(
      params.values(), torch::optim::AdamWOptions(f.lr).betas({0.9, 0.95}).weight_decay(f.weight_decay));
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int run_rank(const Flags& f) {
  const bool launched = std::getenv("RANK") != nullptr;
  auto group = launched ? muon::dist::init_from_env() : muon::dist::Group::single();
  const int rank = group.rank();
  const int world = group.size();
  const auto cores = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(static_cast<int>(f.threads > 0 ? f.threads : std::max<int64_t>(1, cores / world)));

  std::string text;
  if (f.data_file.empty()) {
    text = train_gpt::generate_corpus(f.chars);
  } else {
    std::ifstream in(f.data_file, std::ios::binary);
    TORCH_CHECK_VALUE(in.good(), "[muon-train-gpt] --data: cannot read '", f.data_file, "'");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto data = train_gpt::make_dataset(text, 0.1, f.byte_level);
  if (rank == 0) {
    train_gpt::GptConfig c = f.train.model;
    c.vocab_size = data.vocab.size();
    at::manual_seed(0);
    const auto params = train_gpt::Gpt(c)->num_parameters();
    std::printf("muon-train-gpt: %d rank(s), %lld parameters, vocab %lld, %lld train / %lld valid tokens\n",
                world, static_cast<long long>(params), static_cast<long long>(c.vocab_size),
                static_cast<long long>(data.train.numel()), static_cast<long long>(data.valid.numel()));
    std::fflush(stdout);
  }
  train_gpt::DataParallel dp;
  dp.rank = rank;
  dp.world = world;
  dp.all_reduce_sum = [&group](std::vector<at::Tensor>& tensors) {
    for (auto& t : tensors) group.all_reduce_(t);
  };

  if (rank == 0) fs::create_directories(f.out);
  if (!f.save.empty() && rank == 0) fs::create_directories(f.save);
  group.barrier();
  std::vector<train_gpt::RunLog> logs;
  for (const auto& run : split_list(f.runs)) {
    auto o = f.train;
    o.name = run;
    o.out_dir = f.out;
    if (!f.save.empty()) o.save_checkpoint = (fs::path(f.save) / (run + ".ckpt")).string();
    if (!f.resume.empty()) o.resume = (fs::path(f.resume) / (run + ".ckpt")).string();
    auto factory = [&](train_gpt::Gpt& model) -> std::unique_ptr<torch::optim::Optimizer> {
      const auto named = model->named_parameters();
      if (world == 1 || f.layout == "replicated") return make_local_optimizer(run, named, f);
      return std::make_unique<muon::dist::LayerwiseOptimizer>(
          named, group, [&](const torch::OrderedDict<std::string, at::Tensor>& owned) {
            return make_local_optimizer(run, owned, f);
          });
    };
    logs.push_back(train_gpt::train(data, o, factory, dp));
  }
  if (rank != 0) return 0;
  const size_t baseline = logs.size() - 1;  // the last run (adamw by default)
  std::printf("\n%s", train_gpt::comparison_table(logs, baseline).c_str());
  std::printf("CSV logs: %s/<run>.csv\n", f.out.c_str());
  if (f.plot) {
    const auto script = find_plot_script();
    const auto png = (fs::path(f.out) / "loss.png").string();
    std::string cmd = "/usr/bin/python3 '" + script + "' '" + png + "'";
    for (const auto& log : logs) cmd += " '" + (fs::path(f.out) / (log.name + ".csv")).string() + "'";
    cmd += " > /dev/null";
    if (script.empty() || std::system(cmd.c_str()) != 0) {
      std::printf("plot: not written (needs /usr/bin/python3 with matplotlib)\n");
    } else {
      std::printf("plot: %s\n", png.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Train a small GPT with Muon and with AdamW and compare them.");
  Flags f;
  auto& t = f.train;
  app.add_option("--nproc", f.nproc, "local ranks (started through muon-launch)")->check(CLI::Range(1, 64));
  app.add_option("--threads", f.threads, "compute threads per rank (0: cores / ranks)");
  app.add_option("--runs", f.runs, "comma-separated runs: muon, adamw; the last is the baseline");
  app.add_option("--steps", t.steps, "optimizer steps per run")->check(CLI::PositiveNumber);
  app.add_option("--batch", t.global_batch, "sequences per step over all ranks")->check(CLI::PositiveNumber);
  app.add_option("--eval-every", t.eval_every, "steps between evaluations")->check(CLI::PositiveNumber);
  app.add_option("--eval-windows", t.eval_windows, "validation windows")->check(CLI::PositiveNumber);
  app.add_option("--seed", t.seed, "seed of the model and the batches");
  app.add_option("--layers", t.model.layers, "transformer blocks");
  app.add_option("--width", t.model.width, "model width");
  app.add_option("--heads", t.model.heads, "attention heads");
  app.add_option("--context", t.model.context, "context length (characters)");
  app.add_option("--norm", t.model.norm, "rms | layer")->check(CLI::IsMember({"rms", "layer"}));
  app.add_option("--data", f.data_file, "train on this text file instead of the generated corpus");
  app.add_option("--chars", f.chars, "size of the generated corpus")->check(CLI::PositiveNumber);
  app.add_flag("--byte-level", f.byte_level, "256 byte tokens instead of the text's characters");
  app.add_option("--out", f.out, "directory of the CSV logs and the plot");
  app.add_option("--save", f.save, "directory to write a checkpoint per run (one file per rank)");
  app.add_option("--resume", f.resume, "directory of checkpoints to resume from (same ranks)");
  app.add_flag("!--no-plot", f.plot, "skip the PNG plot");
  app.add_flag("!--no-progress", t.progress, "no progress bar");
  app.add_option("--optimizer-layout", f.layout,
                 "with several ranks: layerwise (each rank updates its share) or replicated "
                 "(every rank runs the whole optimizer)")
      ->check(CLI::IsMember({"layerwise", "replicated"}));
  app.add_option("--lr", f.lr, "AdamW learning rate (the baseline and Muon's AdamW half)");
  app.add_option("--muon-lr", f.muon_lr, "Muon learning rate");
  app.add_option("--weight-decay", f.weight_decay, "decoupled weight decay");
  CLI11_PARSE(app, argc, argv);

  try {
    if (f.nproc > 1 && std::getenv("RANK") == nullptr) {
      // Re-run this program as N ranks under the launcher.
      std::vector<std::string> args{find_launcher(), "-n", std::to_string(f.nproc), "--"};
      args.push_back(fs::canonical("/proc/self/exe").string());
      for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execvp(cargs[0], cargs.data());
      std::fprintf(stderr, "muon-train-gpt: cannot start %s: %s\n", cargs[0], std::strerror(errno));
      return 1;
    }
    return run_rank(f);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "muon-train-gpt: %s\n", e.what_without_backtrace());
    return 1;
  }
}
