#pragma once

/// One training run of the small GPT: data-parallel over the ranks of a
/// communicator (gradients averaged across ranks), evaluation, progress,
/// checkpoints, and the run's log.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data.h"
#include "gpt.h"
#include "progress.h"
#include "report.h"

namespace train_gpt {

/// What a run needs from the processes it runs on. A single process is
/// {rank 0, world 1} with no-op collectives.
struct DataParallel {
  /// This rank.
  int64_t rank = 0;
  /// Number of ranks.
  int64_t world = 1;
  /// Sums each tensor over the ranks, in place (every rank gets the sum).
  std::function<void(std::vector<at::Tensor>&)> all_reduce_sum = [](std::vector<at::Tensor>&) {};
  /// Averages the parameters' gradients over the ranks, in place (e.g.
  /// muon::dist::all_reduce_gradients).
  std::function<void(const std::vector<at::Tensor>&)> average_gradients =
      [](const std::vector<at::Tensor>&) {};
};

/// How a run trains.
struct TrainOptions {
  /// Run name: the CSV is `<out_dir>/<name>.csv`.
  std::string name = "run";
  /// Model shape (vocab_size is set from the data).
  GptConfig model;
  /// Optimizer steps.
  int64_t steps = 400;
  /// Sequences per step over all ranks (a multiple of the world size).
  int64_t global_batch = 32;
  /// Evaluate every this many steps (and at the first and last step).
  int64_t eval_every = 25;
  /// Validation windows of context + 1 tokens.
  int64_t eval_windows = 128;
  /// Seed of the model initialization and of the batches.
  uint64_t seed = 1;
  /// Where the CSV log goes (written by rank 0; empty: no CSV).
  std::string out_dir;
  /// Checkpoint written at the end (empty: none); rank r writes `<path>.rank<r>`
  /// (through a temporary file renamed into place, so a failed write leaves
  /// no partial checkpoint). It records the world size, `layout` and the
  /// model's shape.
  std::string save_checkpoint;
  /// Checkpoint to resume from (as written by save_checkpoint). Its world
  /// size, layout and model shape must be this run's: a difference raises
  /// c10::ValueError on every rank naming it ("checkpoint <path> was written
  /// by 2 ranks (layer-wise), this run has 1 (single process)", "... with
  /// --width 64, this run has --width 32").
  std::string resume;
  /// How the optimizer is laid out over the ranks, in words, recorded in
  /// checkpoints: "single process", "layer-wise" or "replicated".
  std::string layout = "single process";
  /// Show a progress bar (rank 0).
  bool progress = true;
};

/// Builds the optimizer of a run from the model's named parameters.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(Gpt&)>;

/// Sets the learning rates for a step (called before each step with its index).
using LrSetter = std::function<void(int64_t step)>;
/// Builds the LR setter of a run over its fresh optimizer (before a
/// checkpoint is loaded into it, so base learning rates are the configured
/// ones).
using ScheduleFactory = std::function<LrSetter(torch::optim::Optimizer&)>;

/// Trains a fresh model (initialized from `options.seed`, identical on every
/// rank) for `options.steps` steps; returns the log (identical on every rank).
RunLog train(const Dataset& data, const TrainOptions& options, const OptimizerFactory& make_optimizer,
             const DataParallel& dp, const ScheduleFactory& make_schedule = nullptr);

}  // namespace train_gpt
