// muon-train-gpt: trains a small GPT with the Muon hybrid (AdamW for the
// embeddings, head, norms and biases) and with AdamW alone, at the same seed
// and token budget, data-parallel over local processes, and compares them.
//
//   muon-train-gpt                     # defaults: 2 ranks, muon vs adamw
//   muon-train-gpt --nproc 1 --steps 200 --runs muon,lion,adamw
//   muon-train-gpt --set muon:lr=0.03 --config adamw=my_adamw.json
//   muon-train-gpt --print-config      # every run's optimizer config as JSON
//   muon-train-gpt --plugin ./libmy_optimizer.so --runs my_optimizer,adamw
//   muon-train-gpt --runs my_muon.json,adamw      # a run named my_muon, built from the file
//   muon-train-gpt --timeout 30         # ranks wait 30 s for each other, not 300
//   muon-train-gpt --device cuda --nproc 2   # each rank on its GPU, NCCL between them
//   torchrun --no_python --nproc_per_node 2 muon-train-gpt
//
// Each run is an optimizer of muon's registry configured by one
// muon::OptimizerConfig: the run's preset (runs.h), then JSON
// files (--config FILE for every run, --config RUN=FILE for one), then
// --set RUN:FIELD=VALUE (RUN may be "all"). With --nproc N > 1 and no
// launcher around it, it starts N ranks of itself through muon-launch; with
// more than one rank the gradients are averaged and the optimizer runs
// layer-wise distributed (config field layout = layerwise). The ranks first
// compare their flags, and rank 0's model is broadcast to all (as DDP does).
// --save DIR writes reshardable checkpoints (muon::distributed::save_checkpoint) to
// DIR/<run>/step-<N>; --resume DIR continues each run from the newest in
// DIR/<run>/, at any --nproc and --optimizer-layout; --resume auto from
// --save's newest where there is one (torchrun --max-restarts: a restarted
// job continues by itself).
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "compare.h"
#include "data.h"
#include "device.h"
#include "directories.h"
#include "gpt.h"
#include "layouts.h"
#include "muon/config.h"
#include "muon/distributed/runtime/agreement.h"
#include "muon/distributed/runtime/group.h"
#include "muon/plugin.h"
#include "muon/registry.h"
#include "muon/schedule.h"
#include "presets.h"
#include "report.h"
#include "runs.h"
#include "text.h"
#include "trainer.h"

namespace fs = std::filesystem;

namespace {

using train_gpt::clip;
using train_gpt::one_line;
using train_gpt::run_name;
using train_gpt::run_names;
using train_gpt::split_list;

struct Flags {
  train_gpt::TrainOptions train;
  std::string preset = "small";
  int64_t nproc = 2;
  int64_t threads = 1;  // LibTorch intra-op threads per rank
  int64_t chars = 2'000'000;
  std::string data_file;
  bool byte_level = false;
  std::string runs = "muon,adamw";
  std::vector<std::string> plugins;  // shared libraries that register optimizers
  std::string out = "train_gpt_out";
  std::string save;
  int64_t save_every = 0;
  int64_t keep = 2;
  std::string resume;
  bool plot = true;
  std::string layout = "layerwise";
  std::string parallel = "ddp";
  int64_t tp = 0;  // tensor-parallel ranks; 0: the layout's default
  bool compare_layouts = false;
  std::string summary;  // JSON of every run's final losses and costs (rank 0)
  std::vector<int> compare_ranks{2, 4};
  double timeout = 0;  // seconds of the rendezvous and collective timeout; 0: the library's
  // Optimizer configs: JSON files (run name, "" for every run) and field settings.
  std::vector<std::string> configs;
  std::vector<std::string> sets;
  bool print_config = false;
  bool explain = false;
  std::string device = "cpu";  // cpu | cuda (each rank on cuda:<LOCAL_RANK>)
};

// The flags a run's optimizer config is built from.
train_gpt::RunConfigFlags run_flags(const Flags& f) {
  return {f.train.steps, f.train.model.experts, f.configs, f.sets, f.preset};
}

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

// The flags every rank must share, as the ranks compare them: a rank
// started with another --width or --steps would train another model or
// leave the others waiting. --seed may differ (rank 0's model is broadcast)
// and so may --threads.
std::vector<muon::distributed::AgreementItem> shared_flags(const Flags& f) {
  const auto& t = f.train;
  std::string configs;
  for (const auto& c : f.configs) configs += c + " ";
  std::string sets;
  for (const auto& s : f.sets) sets += s + " ";
  std::string plugins;
  for (const auto& p : f.plugins) plugins += p + " ";
  return {{"--preset", f.preset},
          {"--runs", f.runs},
          {"--plugin", plugins},
          {"--steps", std::to_string(t.steps)},
          {"--batch", std::to_string(t.global_batch)},
          {"--eval-every", std::to_string(t.eval_every)},
          {"--eval-windows", std::to_string(t.eval_windows)},
          {"--layers", std::to_string(t.model.layers)},
          {"--width", std::to_string(t.model.width)},
          {"--heads", std::to_string(t.model.heads)},
          {"--context", std::to_string(t.model.context)},
          {"--norm", t.model.norm},
          {"--data", f.data_file},
          {"--chars", std::to_string(f.chars)},
          {"--byte-level", f.byte_level ? "on" : "off"},
          {"--optimizer-layout", f.layout},
          {"--parallel", f.parallel},
          {"--tp", std::to_string(f.tp)},
          {"--experts", std::to_string(t.model.experts)},
          {"--summary", f.summary},
          {"--config", configs},
          {"--set", sets},
          {"--save", f.save},
          {"--save-every", std::to_string(f.save_every)},
          {"--keep", std::to_string(f.keep)},
          {"--resume", f.resume},
          {"--device", f.device},
          {"--qk-clip", std::to_string(t.qk_clip)},
          {"--log-max-logits", t.log_max_logits ? "on" : "off"}};
}

// A whole number >= `min` that fits int64, checked on the flag's text:
// CLI11 2.1 reads a longer number as INT64_MAX without a word, and its
// PositiveNumber accepts fractions.
CLI::Validator count(int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc::result_out_of_range) return "'" + clip(text) + "' does not fit in 64 bits";
        if (ec != std::errc() || ptr != end || v < min) {
          return "'" + clip(text) + "' is not a whole number >= " + std::to_string(min);
        }
        return "";
      },
      min > 0 ? "POSITIVE" : "NONNEGATIVE");
}

// The ranks of the job: the launcher's (torchrun's variables), over NCCL
// for CUDA and Gloo for the CPU, waiting --timeout where given; this process
// alone without a launcher.
muon::distributed::Group join_ranks(const Flags& f, const at::Device& device) {
  if (std::getenv("RANK") == nullptr) return muon::distributed::Group::single();
  auto options = muon::distributed::GroupOptions().backend(train_gpt::group_backend(device));
  if (f.timeout > 0) {
    const auto ms = static_cast<int64_t>(std::llround(f.timeout * 1000));
    options.timeout(std::chrono::milliseconds(std::max<int64_t>(ms, 1)));
  }
  return muon::distributed::init_from_env(options);
}

// The dataset of --data, or of the generated corpus; rank 0 prints its
// size, the model's and where the ranks compute.
train_gpt::Dataset load_data(const Flags& f, const muon::distributed::Group& group,
                             const std::string& where) {
  std::string text;
  if (f.data_file.empty()) {
    text = train_gpt::generate_corpus(f.chars);
  } else {
    std::ifstream in(f.data_file, std::ios::binary);
    TORCH_CHECK_VALUE(in.good(), "[muon-train-gpt] --data: cannot read '", f.data_file, "'");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto data = train_gpt::make_dataset(text, 0.1, f.byte_level);
  if (group.rank() == 0) {
    train_gpt::GptConfig c = f.train.model;
    c.vocab_size = data.vocab.size();
    at::manual_seed(0);
    const auto params = train_gpt::Gpt(c)->num_parameters();
    std::printf("muon-train-gpt: %d rank(s) on %s, %lld parameters, vocab %lld, "
                "%lld train / %lld valid tokens\n",
                group.size(), where.c_str(), static_cast<long long>(params),
                static_cast<long long>(c.vocab_size), static_cast<long long>(data.train.numel()),
                static_cast<long long>(data.valid.numel()));
    std::fflush(stdout);
  }
  return data;
}

int run_rank(const Flags& f) {
  // The device first: a rank without one stops before the rendezvous.
  const auto device = train_gpt::rank_device(f.device);
  const auto group = join_ranks(f, device);
  const int world = group.size();
  at::set_num_threads(static_cast<int>(f.threads));
  muon::distributed::check_ranks_agree(group, shared_flags(f), "[muon-train-gpt] ",
                                "start every rank with the same flags");
  const auto where = train_gpt::describe_devices(device, world);
  const auto data = load_data(f, group, where);
  const auto parallel = train_gpt::parse_parallel(f.parallel);
  const int tp_size = train_gpt::tensor_parallel_size(parallel, world, static_cast<int>(f.tp),
                                                      f.train.model.heads);
  const auto mesh = train_gpt::make_mesh(parallel, group, tp_size);
  train_gpt::DataParallel dp;
  dp.rank = mesh.dp.rank();
  dp.world = mesh.dp.size();
  dp.all_reduce_sum = [dp_group = mesh.dp](std::vector<at::Tensor>& tensors) {
    for (auto& t : tensors) dp_group.all_reduce_(t);
  };

  // Every rank checks the directories (each raises the same error, so none
  // waits for another), before any run starts.
  const auto specs = split_list(f.runs);
  train_gpt::make_directory("--out", f.out);
  train_gpt::check_save_directories(f.save, run_names(f.runs));
  group.barrier();
  std::vector<train_gpt::RunLog> logs;
  for (const auto& spec : specs) {
    const auto run = run_name(spec);
    auto o = f.train;
    o.name = run;
    o.out_dir = f.out;
    o.layout = train_gpt::describe(parallel, mesh, f.layout);
    if (!f.save.empty()) o.save_dir = (fs::path(f.save) / run).string();
    o.save_every = f.save_every;
    o.keep = f.keep;
    if (f.resume == "auto") {
      o.resume = train_gpt::auto_resume_directory(group, (fs::path(f.save) / run).string(), run);
    } else if (!f.resume.empty()) {
      o.resume = (fs::path(f.resume) / run).string();
    }
    if (mesh.tp.size() > 1) {
      // The ranks of a tensor-parallel group compute one model on one batch:
      // they take the seed of its first rank (batches follow the seed).
      auto seed = at::full({1}, static_cast<int64_t>(o.seed), at::dtype(at::kLong).device(device));
      mesh.tp.broadcast_(seed, 0);
      o.seed = static_cast<uint64_t>(seed.item<int64_t>());
    }
    // The checkpoints are saved and loaded over the world.
    o.world = group;
    o.tensor_parallel = mesh.tp;
    o.counted_groups = mesh.distinct;
    o.device = device;
    const auto config = train_gpt::run_config(spec, run_flags(f));
    auto factory = [&](train_gpt::Gpt& model) {
      if (f.explain && group.rank() == 0) {
        std::printf("run '%s':\n%s\n", run.c_str(), muon::explain(model->named_parameters(), config).c_str());
      }
      return train_gpt::make_layout(parallel, mesh, model, config, f.layout);
    };
    auto schedule = [&](torch::optim::Optimizer& opt) -> train_gpt::LrSetter {
      auto s = std::make_shared<muon::WarmupDecaySchedule>(opt, muon::lr_schedule_options(config));
      return [s](int64_t step) { s->set_step(step); };
    };
    logs.push_back(train_gpt::train(data, o, train_gpt::LayoutFactory(factory), dp, schedule));
  }
  if (group.rank() != 0) return 0;
  if (!f.summary.empty()) train_gpt::write_summary(f.summary, f.parallel, world, logs, where);
  const size_t baseline = logs.size() - 1;  // the last run (adamw by default)
  std::printf("\n%s", train_gpt::comparison_table(logs, baseline, where).c_str());
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

// The flags of the model, the data and the training run.
void add_model_flags(CLI::App& app, Flags& f) {
  auto& t = f.train;
  app.add_option("--preset", f.preset, "small | kjv: a model, corpus and budget (presets.h); flags win")
      ->check(CLI::IsMember(train_gpt::preset_names()));
  app.add_option("--steps", t.steps, "optimizer steps per run")->check(count(1));
  app.add_option("--batch", t.global_batch, "sequences per step over all ranks")->check(count(1));
  app.add_option("--eval-every", t.eval_every, "steps between evaluations")->check(count(1));
  app.add_option("--eval-windows", t.eval_windows, "validation windows")->check(count(1));
  app.add_option("--seed", t.seed, "seed of the model and the batches");
  app.add_option("--layers", t.model.layers, "transformer blocks");
  app.add_option("--width", t.model.width, "model width");
  app.add_option("--heads", t.model.heads, "attention heads");
  app.add_option("--context", t.model.context, "context length (characters)");
  app.add_option("--norm", t.model.norm, "rms | layer")->check(CLI::IsMember({"rms", "layer"}));
  app.add_option("--data", f.data_file, "train on this text file instead of the generated corpus");
  app.add_option("--chars", f.chars, "size of the generated corpus")->check(count(1));
  app.add_flag("--byte-level", f.byte_level, "256 byte tokens instead of the text's characters");
  app.add_option("--experts", t.model.experts,
                 "mixture-of-experts MLP with this many experts per block (top-1; 0: dense MLP)")
      ->check(CLI::Range(0, 256));
  app.add_option("--qk-clip", t.qk_clip,
                 "QK-clip (MuonClip) threshold TAU: after every step, the q and k rows of each "
                 "head whose largest attention logit of the step exceeded TAU are scaled to bring "
                 "it to TAU; the largest logits are printed at each log point (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--log-max-logits", t.log_max_logits,
               "print the largest attention logits at each log point (without --qk-clip too)");
  app.add_flag("!--no-progress", t.progress, "no progress bar");
  app.add_option("--device", f.device,
                 "cpu, or cuda: each rank on cuda:<LOCAL_RANK> (one CUDA device per rank, NCCL "
                 "between them); refused where LibTorch sees no CUDA device");
}

// The flags of the runs, the ranks, the outputs and checkpoints.
void add_job_flags(CLI::App& app, Flags& f) {
  app.add_option("--nproc", f.nproc, "local ranks (started through muon-launch)")->check(CLI::Range(1, 64));
  app.add_option("--threads", f.threads,
                 "LibTorch intra-op threads per rank (default 1: OpenBLAS threads its GEMMs "
                 "itself, and more oversubscribes the cores)")
      ->check(count(1));
  app.add_option("--runs", f.runs,
                 "comma-separated runs, each a registered optimizer (muon, adamw, ...) or a config file "
                 "(FILE.json: a run named FILE built from it); the last is the baseline");
  app.add_option("--plugin", f.plugins,
                 "a shared library that registers optimizers (muon/plugin.h), loaded before the runs "
                 "are read: its optimizers can be runs; repeatable");
  app.add_option("--out", f.out, "directory of the CSV logs and the plot");
  app.add_option("--save", f.save,
                 "directory of checkpoints: DIR/<run>/step-<N> (model, optimizer state, log), "
                 "written every --save-every steps and at the end; checked writable before step 1");
  app.add_option("--save-every", f.save_every, "steps between checkpoints (0: only at the end)")
      ->check(count(0));
  app.add_option("--keep", f.keep, "complete checkpoints kept per run (the newest)")
      ->check(count(1));
  app.add_option("--resume", f.resume,
                 "directory of a --save: each run continues from the newest complete checkpoint in "
                 "DIR/<run>/ (written at any --nproc and --optimizer-layout; same model shape); "
                 "auto: from --save's newest where there is one, else from step 0 (for restarts)");
  app.add_flag("!--no-plot", f.plot, "skip the PNG plot");
  app.add_option("--optimizer-layout", f.layout,
                 "with several ranks: layerwise (each rank updates its share) or replicated "
                 "(every rank runs the whole optimizer)")
      ->check(CLI::IsMember({"layerwise", "replicated"}));
  app.add_option("--parallel", f.parallel,
                 "how the ranks split the work: single | ddp (data parallel) | sharded (ZeRO-2: "
                 "sharded optimizer state) | tp (tensor parallel) | tp,sharded (2-D)")
      ->check(CLI::IsMember({"single", "ddp", "sharded", "tp", "tp,sharded"}));
  app.add_option("--tp", f.tp,
                 "tensor-parallel ranks of --parallel tp (default: all) or tp,sharded (default 2)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--compare-layouts", f.compare_layouts,
               "run the same runs (100 steps unless --steps) in every --parallel layout at 1, 2 "
               "and 4 ranks (--compare-ranks) and print one table: final val loss and its difference from one process, "
               "optimizer state and parameter bytes per rank, bytes sent per step, ms/step");
  app.add_option("--compare-ranks", f.compare_ranks, "rank counts of --compare-layouts")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  app.add_option("--summary", f.summary, "write every run's final val loss and costs as JSON here");
  app.add_option("--timeout", f.timeout,
                 "seconds the ranks wait for each other (rendezvous and each collective); "
                 "default: MUON_TIMEOUT, else the library's (300)")
      ->check(CLI::Range(1e-3, 7.0 * 24 * 3600));
  app.add_option("--config", f.configs,
                 "optimizer config JSON (muon::OptimizerConfig fields and overrides) for every "
                 "run, or RUN=FILE for one run; repeatable");
  app.add_option("--set", f.sets, "RUN:FIELD=VALUE (RUN: a run name or all); repeatable, after --config");
  app.add_flag("--print-config", f.print_config, "print every run's optimizer config as JSON and exit");
  app.add_flag("--explain", f.explain, "print each run's optimizer and settings per parameter");
}

// --compare-layouts: every layout as a job of this program with the other
// flags of the command line (`argc`, `argv`), one table.
int compare_layouts(const Flags& f, const CLI::App& app, int argc, char** argv) {
  TORCH_CHECK_VALUE(std::getenv("RANK") == nullptr,
                    "[muon-train-gpt] --compare-layouts starts its own jobs; run it without a launcher");
  TORCH_CHECK_VALUE(f.save.empty() && f.resume.empty(),
                    "[muon-train-gpt] --compare-layouts takes neither --save nor --resume");
  // The other flags go to every job; the comparison sets these.
  const std::vector<std::string> own{"--compare-layouts", "--compare-ranks", "--nproc",
                                     "--parallel", "--tp", "--out", "--summary"};
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const auto name = a.substr(0, a.find('='));
    if (std::find(own.begin(), own.end(), name) == own.end()) {
      args.push_back(a);
      continue;
    }
    // Skip the flag's value when it is the next word.
    if (a.find('=') == std::string::npos && name != "--compare-layouts" && i + 1 < argc) ++i;
  }
  // 100 steps unless --steps says otherwise.
  if (app.count("--steps") == 0) args.insert(args.end(), {"--steps", "100"});
  return train_gpt::compare_layouts(fs::canonical("/proc/self/exe").string(), args,
                                    (fs::path(f.out) / "layouts").string(),
                                    train_gpt::layout_jobs(f.compare_ranks, f.train.model.heads));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Train a small GPT with Muon and with AdamW and compare them.");
  Flags f;
  add_job_flags(app, f);
  add_model_flags(app, f);
  // A bad flag is one line and exit status 1, like every other error here
  // (CLI11_PARSE would add a second line and exit with CLI11's own codes).
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "muon-train-gpt: %s\n", clip(one_line(e.what())).c_str());
    return 1;
  }

  try {
    train_gpt::apply_preset(f.preset, [&](const std::string& flag) { return app.count(flag) > 0; },
                            f.train, f.data_file);
    // --device first: no process starts and no rank waits for a device that is not there.
    const bool launched = std::getenv("RANK") != nullptr;
    train_gpt::check_device_flag(f.device, launched || f.compare_layouts ? 1 : f.nproc);
    for (const auto& plugin : f.plugins) muon::load_plugin(plugin);
    // Every run's config is checked here, before any process starts.
    run_names(f.runs);  // distinct names
    for (const auto& spec : split_list(f.runs)) {
      const auto config = train_gpt::run_config(spec, run_flags(f));
      if (f.print_config) std::printf("run '%s':\n%s\n", run_name(spec).c_str(), config.to_json().c_str());
    }
    TORCH_CHECK_VALUE(!split_list(f.runs).empty(), "[muon-train-gpt] --runs names no run");
    if (f.print_config) return 0;
    train_gpt::make_directory("--out", f.out);
    train_gpt::check_save_directories(f.save, run_names(f.runs));
    train_gpt::check_resume_directories(f.resume, f.save, run_names(f.runs));
    if (f.compare_layouts) return compare_layouts(f, app, argc, argv);
    if (f.nproc > 1 && !launched) {
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
    std::fprintf(stderr, "muon-train-gpt: %s\n", one_line(e.what_without_backtrace()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "muon-train-gpt: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
