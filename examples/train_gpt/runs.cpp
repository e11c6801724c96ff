// The runs of --runs: presets and configs.
#include "runs.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "muon/registry.h"
#include "text.h"

namespace train_gpt {
namespace {

namespace fs = std::filesystem;

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
      {"dion2", 0.03},    {"nordion2", 0.03},       {"dion", 0.03},
      {"iso", 1.0},       {"oblique_sgd", 0.01},    {"oblique_adam", 1e-3}, {"moso", 1e-3},
      {"kl_soap", 0.01},  {"kl_m_soap", 0.01},      {"rekls", 0.01},     {"rekls_v3", 0.01}, {"tp_rekls", 0.01},
      {"stacked_soap", 0.01}, {"psgd_pro", 0.03},
  };
  const auto it = lr.find(run);
  return it == lr.end() ? -1.0 : it->second;
}

// Peak learning rates at --preset kjv (width 384 on the King James Bible),
// where a sweep there chose them (docs/train_gpt.md, "At width 384"); an
// entry without one takes its default-task lr above.
double preset_lr(const std::string& run, const std::string& preset) {
  static const std::map<std::string, double> kjv = {
      {"adamw", 5e-4}, {"muon", 0.02}, {"adaptive_muon", 0.04}, {"soap", 1e-3}};
  if (preset == "kjv") {
    const auto it = kjv.find(run);
    if (it != kjv.end()) return it->second;
  }
  return preset_lr(run);
}

// Whether a config file sets `key` (read as JSON text: any occurrence of
// the quoted key).
bool file_sets(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.find("\"" + key + "\"") != std::string::npos;
}

}  // namespace

// The preset of a run: the optimizer it is named after, its tuned learning
// rate, AdamW at its own lr for the parameters a matrix optimizer (an entry
// with default routing rules: muon, soap, ...) leaves to its scalar
// optimizer, and a 5% linear warmup then cosine decay (to 10% of the final
// peak lr: run_config sets min_lr last).
muon::OptimizerConfig run_preset(const std::string& run, int64_t steps, int64_t experts,
                                 const std::string& preset) {
  const auto entry = muon::OptimizerRegistry::global().at(run);  // an unknown run lists the registered names
  muon::OptimizerConfig c;
  c.set("optimizer", run);
  if (preset_lr(run, preset) > 0) c.set("lr", preset_lr(run, preset));
  if (run == "muon" || run == "adaptive_muon") c.set("muon_scale_mode", "shape_scaling");
  if (!entry->default_overrides.empty()) {
    // The scalar optimizer (AdamW: embeddings, head, norms, biases) at AdamW's lr.
    c.add_override(
        muon::OverrideRule().match_optimizer("adamw").set("lr", preset_lr("adamw", preset)).named("adamw lr"));
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
muon::OptimizerConfig run_config(const std::string& spec, const RunConfigFlags& f) {
  const auto run = run_name(spec);
  muon::OptimizerConfig c;
  bool min_lr_given = false;  // else 10% of the final lr
  if (is_config_file(spec)) {
    TORCH_CHECK_VALUE(fs::is_regular_file(spec), "[muon-train-gpt] --runs '", clip(spec),
                      "': no such file (an entry ending in .json is a config file)");
    muon::OptimizerConfig file;
    muon::load_config_file(file, spec);
    c = run_preset(file.get_string("optimizer"), f.steps, f.experts, f.preset);
    muon::load_config_file(c, spec);
    min_lr_given = file_sets(spec, "min_lr");
  } else {
    c = run_preset(run, f.steps, f.experts, f.preset);
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


}  // namespace train_gpt
