#pragma once

/// What a muon-train-gpt checkpoint's manifest says about the run that
/// wrote it: the `extra` text given to muon::distributed::save_checkpoint, as JSON.
/// It is checked before anything is loaded from the checkpoint, and holds
/// the log to continue.
#include <cstdint>
#include <string>
#include <vector>

#include "gpt.h"
#include "report.h"

namespace train_gpt {

/// A run as its checkpoints describe it.
struct CheckpointRun {
  GptConfig model;
  // Informative: how the run that wrote it was laid out, and where ("" in
  // checkpoints written before --device).
  std::string layout;
  int64_t world = 0;
  std::string device;
  // The log up to the checkpoint's step.
  std::vector<EvalPoint> points;
  // Tokens trained on, training and optimizer seconds at the checkpoint's step.
  int64_t tokens = 0;
  double seconds = 0;
  double optimizer_seconds = 0;
  // The steps since the last log point: the sum of their training losses
  // (each the mean over the ranks) and their count.
  double train_loss_sum = 0;
  int64_t train_steps = 0;
};

/// `run` as JSON text (with the format's name and version).
std::string run_to_json(const CheckpointRun& run);

/// The run described by `text`, the manifest's extra text of checkpoint
/// `path`. Raises c10::ValueError naming the checkpoint when the text is
/// not a muon-train-gpt run of this version, is damaged, or has no log
/// point. A checkpoint written before --device reads with device "".
CheckpointRun run_from_json(const std::string& text, const std::string& path);

/// Raises c10::ValueError when the checkpoint `path`'s model `saved`
/// differs from this run's `model`, naming the first difference by its flag
/// ("checkpoint P was written with --width 64, this run has --width 32").
void check_model(const GptConfig& saved, const std::string& path, const GptConfig& model);

}  // namespace train_gpt
