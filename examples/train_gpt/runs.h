#pragma once

/// The runs of muon-train-gpt (--runs): each an optimizer of muon's registry
/// configured by one muon::OptimizerConfig, built from the run's preset (its
/// tuned learning rate and schedule), then JSON files (--config FILE for
/// every run, --config RUN=FILE for one), then --set RUN:FIELD=VALUE (RUN
/// may be "all").
#include <cstdint>
#include <string>
#include <vector>

#include "muon/config.h"

namespace train_gpt {

/// The flags a run's config is built from, besides its --runs entry.
struct RunConfigFlags {
  /// --steps: the length of the learning-rate schedule.
  int64_t steps = 0;
  /// --experts: stacked experts get Muon per expert.
  int64_t experts = 0;
  /// --config FILE (every run) or RUN=FILE (one run), in order.
  std::vector<std::string> configs;
  /// --set RUN:FIELD=VALUE, in order.
  std::vector<std::string> sets;
  /// --preset: its learning rates where it has them (presets.h).
  std::string preset = "small";
};

/// The preset of run `run` (a registered optimizer): its tuned learning
/// rate (at --preset `preset`'s size where it was swept there), AdamW at
/// its own lr for the parameters a matrix optimizer leaves to its scalar
/// optimizer, and a 5% linear warmup then cosine decay over `steps`. An
/// unknown name raises c10::Error listing the registered ones.
muon::OptimizerConfig run_preset(const std::string& run, int64_t steps, int64_t experts,
                                 const std::string& preset = "small");

/// Whether a --runs entry is a config file (FILE.json) rather than a
/// registered optimizer.
bool is_config_file(const std::string& spec);

/// The name of the run a --runs entry describes: the optimizer, or the
/// config file's stem.
std::string run_name(const std::string& spec);

/// A run's config: the preset of its optimizer (a config file's `optimizer`
/// field, "muon" when it has none), then the file, then `flags.configs`
/// for every run or for this one, then `flags.sets`; min_lr is 10% of the
/// final lr unless one of them sets it. Raises c10::ValueError naming the
/// flag for a missing file, a directory or a malformed --set.
muon::OptimizerConfig run_config(const std::string& spec, const RunConfigFlags& flags);

/// The non-empty items of a comma-separated list.
std::vector<std::string> split_list(const std::string& text);

/// The names of the runs of --runs, each distinct (they name files and
/// directories): a name given twice raises c10::ValueError.
std::vector<std::string> run_names(const std::string& runs);

}  // namespace train_gpt
