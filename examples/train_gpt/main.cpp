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
//   torchrun --no_python --nproc_per_node 2 muon-train-gpt
//
// Each run is an optimizer of muon's registry configured by one
// muon::OptimizerConfig: the run's preset (run_preset below), then JSON
// files (--config FILE for every run, --config RUN=FILE for one), then
// --set RUN:FIELD=VALUE (RUN may be "all"). With --nproc N > 1 and no
// launcher around it, it starts N ranks of itself through muon-launch; with
// more than one rank the gradients are averaged and the optimizer runs
// layer-wise distributed (config field layout = layerwise). The ranks first
// compare their flags, and rank 0's model is broadcast to all (as DDP does).
// --save DIR writes reshardable checkpoints (muon::dist::save_checkpoint) to
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
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "compare.h"
#include "data.h"
#include "gpt.h"
#include "layouts.h"
#include "muon/config.h"
#include "muon/dist/checkpoints/checkpoint.h"
#include "muon/dist/layouts/layerwise.h"
#include "muon/dist/layouts/make.h"
#include "muon/dist/runtime/agreement.h"
#include "muon/dist/runtime/group.h"
#include "muon/plugin.h"
#include "muon/registry.h"
#include "muon/schedule.h"
#include "report.h"
#include "trainer.h"

namespace fs = std::filesystem;

namespace {

struct Flags {
  train_gpt::TrainOptions train;
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
};

// Text from the command line in a message: at most this many characters.
constexpr size_t kMaxShown = 200;

std::string clip(const std::string& text) {
  return text.size() <= kMaxShown ? text : text.substr(0, kMaxShown - 3) + "...";
}

// The directory `path` of `flag`, created if missing; a path that cannot be
// a directory (under a regular file, a file itself) raises c10::ValueError
// naming the flag before anything is written.
void make_directory(const char* flag, const std::string& path) {
  std::error_code error;
  fs::create_directories(path, error);
  TORCH_CHECK_VALUE(!error && fs::is_directory(path), "[muon-train-gpt] ", flag, " '", clip(path),
                    "': cannot create this directory: ",
                    error ? error.message() : "a file of that name exists");
}

// The checkpoint directory `path` of `flag`, created if missing and checked
// writable (muon::dist::check_checkpoint_dir): otherwise c10::ValueError
// naming the flag and the path, before any step.
void check_save_directory(const char* flag, const std::string& path) {
  try {
    muon::dist::check_checkpoint_dir(path);
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    const std::string who = "[muon::dist::check_checkpoint_dir] ";
    if (why.rfind(who, 0) == 0) why.erase(0, who.size());
    TORCH_CHECK_VALUE(false, "[muon-train-gpt] ", flag, " '", clip(path), "': ", why);
  }
}

// --resume auto: each run continues from the newest complete checkpoint
// under --save if it has one, and starts at step 0 if not (a job restarted
// by its launcher, e.g. torchrun --max-restarts, continues by itself).
bool resume_auto(const Flags& f) { return f.resume == "auto"; }

// Every run has a complete checkpoint under --resume (its model shape is
// checked by the trainer, against the data's vocabulary); --resume auto
// needs --save.
void check_resume_directories(const Flags& f, const std::vector<std::string>& runs) {
  if (f.resume.empty()) return;
  if (resume_auto(f)) {
    TORCH_CHECK_VALUE(!f.save.empty(),
                      "[muon-train-gpt] --resume auto continues from the checkpoints of --save; give --save DIR");
    return;
  }
  for (const auto& run : runs) {
    const auto dir = (fs::path(f.resume) / run).string();
    TORCH_CHECK_VALUE(muon::dist::latest_checkpoint(dir).has_value(), "[muon-train-gpt] --resume '",
                      clip(f.resume), "': no complete checkpoint of run '", run, "' in '",
                      clip(dir), "'");
  }
}

// The directories of every run's checkpoints under --save, checked.
void check_save_directories(const Flags& f, const std::vector<std::string>& runs) {
  if (f.save.empty()) return;
  check_save_directory("--save", f.save);
  for (const auto& run : runs) check_save_directory("--save", (fs::path(f.save) / run).string());
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

// Learning rates from the sweep in docs/train_gpt.md (the best of each
// optimizer on the default task and budget).
constexpr double kMuonLr = 0.02;
constexpr double kAdamwLr = 4e-3;

// Peak learning rates of the other registry entries on the default task:
// the best of a sweep at 200 steps over 3–5 values per entry
// (examples/train_gpt/sweep_lr.sh; docs/optimizers.md, "The main job").
// Entries not listed (a plugin's) run at the registry's lr.
double preset_lr(const std::string& run) {
  static const std::map<std::string, double> lr = {
      {"muon", kMuonLr},  {"adaptive_muon", kMuonLr}, {"adamw", kAdamwLr}, {"adam", kAdamwLr},
      {"sgd", 0.03},      {"lion", 6e-4},             {"signum", 6e-4},    {"laprop", 4e-3},
      {"sim_ademamix", 3e-4}, {"soap", 4e-3},         {"polargrad", 0.3},  {"scion", 0.08},
      {"mop", 4e-3},      {"spel", 0.08},             {"muon_hyperball", 0.1},
      {"dion2", 0.03},    {"nordion2", 0.03},
  };
  const auto it = lr.find(run);
  return it == lr.end() ? -1.0 : it->second;
}

// The preset of a run: the optimizer it is named after, its tuned learning
// rate, AdamW at its own lr for the parameters a matrix optimizer (an entry
// with default routing rules: muon, soap, ...) leaves to its scalar
// optimizer, and a 5% linear warmup then cosine decay (to 10% of the final
// peak lr: run_config sets min_lr last).
muon::OptimizerConfig run_preset(const std::string& run, int64_t steps, int64_t experts) {
  const auto entry = muon::OptimizerRegistry::global().at(run);  // an unknown run lists the registered names
  muon::OptimizerConfig c;
  c.set("optimizer", run);
  if (preset_lr(run) > 0) c.set("lr", preset_lr(run));
  if (run == "muon" || run == "adaptive_muon") c.set("muon_scale_mode", "shape_scaling");
  if (!entry->default_overrides.empty()) {
    // The scalar optimizer (AdamW: embeddings, head, norms, biases) at AdamW's lr.
    c.add_override(muon::OverrideRule().match_optimizer("adamw").set("lr", kAdamwLr).named("adamw lr"));
  }
  if (c.get_string("optimizer") != "sgd") c.set("adam_beta2", 0.95);
  if (experts > 0 && run == "muon") {
    // Stacked experts (experts, out, in): each expert orthogonalized alone.
    c.add_override(muon::OverrideRule()
                       .match_name("*.experts_fc*")
                       .match_optimizer("muon")
                       .set("muon_stacked_experts", true)
                       .named("stacked experts"));
  }
  c.set("lr_warmup_steps", std::max<int64_t>(1, steps / 20))
      .set("lr_decay_steps", steps)
      .set("lr_decay_style", "cosine");
  return c;
}

// Whether a config file sets `key` (read as JSON text: any occurrence of
// the quoted key).
bool file_sets(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.find("\"" + key + "\"") != std::string::npos;
}

// Whether a --runs entry is a config file (a run named after the file's
// stem, built from the file) rather than a registered optimizer.
bool is_config_file(const std::string& spec) {
  return spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0;
}

// The name of the run a --runs entry describes: the optimizer, or the
// config file's stem.
std::string run_name(const std::string& spec) {
  return is_config_file(spec) ? fs::path(spec).stem().string() : spec;
}

// A run's config: the preset of its optimizer (a config file's `optimizer`
// field, "muon" when it has none), then the file, then --config files for
// every run or for this one, then --set.
muon::OptimizerConfig run_config(const std::string& spec, const Flags& f) {
  const auto run = run_name(spec);
  muon::OptimizerConfig c;
  bool min_lr_given = false;  // else 10% of the final lr
  if (is_config_file(spec)) {
    TORCH_CHECK_VALUE(fs::is_regular_file(spec), "[muon-train-gpt] --runs '", clip(spec),
                      "': no such file (an entry ending in .json is a config file)");
    muon::OptimizerConfig file;
    muon::load_config_file(file, spec);
    c = run_preset(file.get_string("optimizer"), f.train.steps, f.train.model.experts);
    muon::load_config_file(c, spec);
    min_lr_given = file_sets(spec, "min_lr");
  } else {
    c = run_preset(run, f.train.steps, f.train.model.experts);
  }
  for (const auto& config : f.configs) {
    const auto eq = config.find('=');
    const std::string who = eq == std::string::npos ? "" : config.substr(0, eq);
    if (!who.empty() && who != run) continue;
    const auto path = eq == std::string::npos ? config : config.substr(eq + 1);
    TORCH_CHECK_VALUE(!fs::is_directory(path), "[muon-train-gpt] --config '", clip(path),
                      "' is a directory; give a JSON file");
    muon::load_config_file(c, path);
    min_lr_given = min_lr_given || file_sets(path, "min_lr");
  }
  for (const auto& set : f.sets) {
    const auto colon = set.find(':');
    const auto eq = set.find('=');
    TORCH_CHECK_VALUE(colon != std::string::npos && eq != std::string::npos && colon < eq,
                      "[muon-train-gpt] --set takes RUN:FIELD=VALUE, got '", clip(set), "'");
    const auto who = set.substr(0, colon);
    if (who != "all" && who != run) continue;
    c.set_from_string(set.substr(colon + 1, eq - colon - 1), set.substr(eq + 1));
    min_lr_given = min_lr_given || set.substr(colon + 1, eq - colon - 1) == "min_lr";
  }
  if (!min_lr_given) c.set("min_lr", 0.1 * c.get_double("lr"));
  return c;
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

// The names of the runs of --runs (each distinct: they name files and directories).
std::vector<std::string> run_names(const std::string& runs) {
  std::vector<std::string> names;
  for (const auto& spec : split_list(runs)) {
    const auto name = run_name(spec);
    TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), name) == names.end(),
                      "[muon-train-gpt] --runs names run '", clip(name), "' twice");
    names.push_back(name);
  }
  return names;
}

// The flags every rank must share, as the ranks compare them: a rank
// started with another --width or --steps would train another model or
// leave the others waiting. --seed may differ (rank 0's model is broadcast)
// and so may --threads.
std::vector<muon::dist::AgreementItem> shared_flags(const Flags& f) {
  const auto& t = f.train;
  std::string configs;
  for (const auto& c : f.configs) configs += c + " ";
  std::string sets;
  for (const auto& s : f.sets) sets += s + " ";
  std::string plugins;
  for (const auto& p : f.plugins) plugins += p + " ";
  return {{"--runs", f.runs},
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

// An error as one line of output: its lines joined.
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (auto& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

// --resume auto for one run: the step directory of the newest checkpoint
// in `dir` that verifies (every byte read against its checksums), "" (start
// at step 0) when `dir` holds no complete checkpoint. A newer one that does
// not verify (a kill or a disk that damaged it) is skipped, saying which and
// why, so that an elastic job's restart goes on from the one before; when
// complete checkpoints exist and none verifies, every rank refuses, naming
// the newest and why, rather than start the run over. Every rank looks, and
// the ranks agree on the checkpoint they found: a rank that sees another
// (a directory not shared by every node) raises c10::ValueError on every
// rank. The reasons are the library's messages, bounded in length.
std::string auto_resume_directory(const muon::dist::Group& group, const std::string& dir,
                                  const std::string& run) {
  std::vector<muon::dist::SkippedCheckpoint> skipped;
  const auto latest = muon::dist::latest_verified_checkpoint(dir, &skipped);
  const int64_t step = latest ? latest->step : -1;
  std::string found = latest ? "step " + std::to_string(step) : "none";
  if (!skipped.empty()) found += " (" + std::to_string(skipped.size()) + " newer damaged)";
  muon::dist::check_ranks_agree(
      group, {{"the newest checkpoint of run '" + run + "' in '" + clip(dir) + "' that verifies", found}},
      "[muon-train-gpt] --resume auto: ", "--save must be one directory every rank sees");
  TORCH_CHECK_VALUE(latest || skipped.empty(), "[muon-train-gpt] --resume auto: run '", run,
                    "': no checkpoint in '", clip(dir), "' verifies (the newest, ", clip(skipped.front().path),
                    ": ", skipped.front().reason, "); move the damaged ones away to start over");
  if (group.rank() == 0) {
    for (const auto& s : skipped) {
      std::printf("run '%s': --resume auto: skipping the damaged checkpoint %s: %s\n", run.c_str(),
                  clip(s.path).c_str(), s.reason.c_str());
    }
    if (latest) {
      std::printf("run '%s': --resume auto: continuing from step %lld (%s)\n", run.c_str(),
                  static_cast<long long>(step), latest->path.c_str());
    } else {
      std::printf("run '%s': --resume auto: no checkpoint in %s yet, starting at step 0\n",
                  run.c_str(), clip(dir).c_str());
    }
    std::fflush(stdout);
  }
  return latest ? latest->path : "";
}

int run_rank(const Flags& f) {
  const bool launched = std::getenv("RANK") != nullptr;
  muon::dist::Group group = muon::dist::Group::single();
  if (launched && f.timeout > 0) {
    const auto ms = static_cast<int64_t>(std::llround(f.timeout * 1000));
    group = muon::dist::init_from_env(
        muon::dist::GroupOptions().timeout(std::chrono::milliseconds(std::max<int64_t>(ms, 1))));
  } else if (launched) {
    group = muon::dist::init_from_env();
  }
  const int rank = group.rank();
  const int world = group.size();
  at::set_num_threads(static_cast<int>(f.threads));
  muon::dist::check_ranks_agree(group, shared_flags(f), "[muon-train-gpt] ",
                                "start every rank with the same flags");

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
  make_directory("--out", f.out);
  check_save_directories(f, run_names(f.runs));
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
    if (resume_auto(f)) {
      o.resume = auto_resume_directory(group, (fs::path(f.save) / run).string(), run);
    } else if (!f.resume.empty()) {
      o.resume = (fs::path(f.resume) / run).string();
    }
    if (mesh.tp.size() > 1) {
      // The ranks of a tensor-parallel group compute one model on one batch:
      // they take the seed of its first rank (batches follow the seed).
      auto seed = at::full({1}, static_cast<int64_t>(o.seed), at::kLong);
      mesh.tp.broadcast_(seed, 0);
      o.seed = static_cast<uint64_t>(seed.item<int64_t>());
    }
    // The checkpoints are saved and loaded over the world.
    o.world = group;
    o.tensor_parallel = mesh.tp;
    o.counted_groups = mesh.distinct;
    const auto config = run_config(spec, f);
    auto factory = [&](train_gpt::Gpt& model) {
      if (f.explain && rank == 0) {
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
  if (rank != 0) return 0;
  if (!f.summary.empty()) train_gpt::write_summary(f.summary, f.parallel, world, logs);
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
  app.add_flag("!--no-progress", t.progress, "no progress bar");
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
  app.add_option("--experts", t.model.experts,
                 "mixture-of-experts MLP with this many experts per block (top-1; 0: dense MLP)")
      ->check(CLI::Range(0, 256));
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
  app.add_option("--qk-clip", t.qk_clip,
                 "QK-clip (MuonClip) threshold TAU: after every step, the q and k rows of each "
                 "head whose largest attention logit of the step exceeded TAU are scaled to bring "
                 "it to TAU; the largest logits are printed at each log point (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--log-max-logits", t.log_max_logits,
               "print the largest attention logits at each log point (without --qk-clip too)");
  app.add_flag("--print-config", f.print_config, "print every run's optimizer config as JSON and exit");
  app.add_flag("--explain", f.explain, "print each run's optimizer and settings per parameter");
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
    for (const auto& plugin : f.plugins) muon::load_plugin(plugin);
    // Every run's config is checked here, before any process starts.
    run_names(f.runs);  // distinct names
    for (const auto& spec : split_list(f.runs)) {
      const auto config = run_config(spec, f);
      if (f.print_config) std::printf("run '%s':\n%s\n", run_name(spec).c_str(), config.to_json().c_str());
    }
    TORCH_CHECK_VALUE(!split_list(f.runs).empty(), "[muon-train-gpt] --runs names no run");
    if (f.print_config) return 0;
    make_directory("--out", f.out);
    check_save_directories(f, run_names(f.runs));
    check_resume_directories(f, run_names(f.runs));
    if (f.compare_layouts) {
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
                                        train_gpt::layout_jobs(f.compare_ranks, t.model.heads));
    }
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
    std::fprintf(stderr, "muon-train-gpt: %s\n", one_line(e.what_without_backtrace()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "muon-train-gpt: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
