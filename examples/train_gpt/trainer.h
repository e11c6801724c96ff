#pragma once

/// One training run of the small GPT: data-parallel over the ranks of a
/// communicator (gradients averaged across ranks), evaluation, progress,
/// reshardable checkpoints (muon/distributed/checkpoints/checkpoint.h), and the run's
/// log.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data.h"
#include "gpt.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/make.h"
#include "muon/distributed/runtime/group.h"
#include "progress.h"
#include "report.h"

namespace train_gpt {

/// What a run needs from the processes it runs on: the data-parallel
/// dimension (ranks that take different rows of each global batch; with
/// tensor parallelism, the ranks of a tensor-parallel group share theirs). A
/// single process is {rank 0, world 1} with no-op collectives.
struct DataParallel {
  /// This rank.
  int64_t rank = 0;
  /// Number of ranks.
  int64_t world = 1;
  /// Sums each tensor over the data-parallel ranks, in place (every rank gets the sum).
  std::function<void(std::vector<at::Tensor>&)> all_reduce_sum = [](std::vector<at::Tensor>&) {};
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
  /// Directory of this run's checkpoints (empty: none): checkpoint N is
  /// `<save_dir>/step-<N>` (muon::distributed::save_checkpoint: the model, the
  /// optimizer state, and in its manifest the model shape, the layout and
  /// world size that wrote it, and the log so far).
  std::string save_dir;
  /// Save every this many steps (0: only at the end); the last step is
  /// always saved.
  int64_t save_every = 0;
  /// Complete checkpoints kept in `save_dir` (the newest; >= 1).
  int64_t keep = 2;
  /// Directory of checkpoints to resume from (a `save_dir`): the newest
  /// complete one in it. It may have been written by any number
  /// of ranks in any optimizer layout (the library reshards it); its model
  /// shape must be this run's: a difference raises c10::ValueError on every
  /// rank naming the flag ("checkpoint <path> was written with --width 64,
  /// this run has --width 32"). The run continues from the checkpoint's
  /// step with its log (learning rates follow from the step).
  std::string resume;
  /// How the parameters and the optimizer are laid out over the ranks: the
  /// layout given to muon::distributed::make_optimizer (for layer-wise, its group).
  /// Default: a single process.
  muon::distributed::DistributedLayout distributed;
  /// Every rank of the run, the group that saves and loads checkpoints.
  /// Invalid (the default): `distributed.group` when valid, else a single
  /// process.
  muon::distributed::Group world;
  /// `distributed` in words, recorded in checkpoints and shown on resume:
  /// "single process", "layer-wise", "replicated", "sharded", ...
  std::string layout = "single process";
  /// The tensor-parallel group of this rank: the model holds its blocks
  /// (Gpt). Invalid (the default): none. The world is then
  /// DataParallel::world × its size ranks.
  muon::distributed::Group tensor_parallel;
  /// Every group the run communicates over, each once: their
  /// muon::distributed::Group::bytes_sent during the steps is RunLog::cost's.
  std::vector<muon::distributed::Group> counted_groups;
  /// QK-clip (MuonClip, muon/qk_clip.h) threshold τ: after every optimizer
  /// step, each block's heads whose largest attention logit of the step
  /// (the MAX over every rank) exceeded τ get their q and k rows of the
  /// fused QKV weight scaled by √(τ / logit) each (muon::distributed::qk_clip_
  /// through the layout: master rows too). 0 (the default): off. At each
  /// log point rank 0 prints the largest logit per block of that step's
  /// forward, the largest since the previous log point and the heads
  /// clipped since then.
  double qk_clip = 0;
  /// Print the largest attention logits at each log point without clipping.
  bool log_max_logits = false;
  /// Show a progress bar (rank 0).
  bool progress = true;
  /// Where the model, its parameters, the batches and the optimizer state
  /// live (--device): the CPU, or this rank's CUDA device. The model is
  /// initialized on the CPU (the same values on every device) and moved
  /// there; the tensors the run sums through DataParallel::all_reduce_sum
  /// and its groups are there too (NCCL takes CUDA tensors only). Clocks
  /// are read after the device's queued work is done. Checkpoints hold CPU
  /// tensors: a run on either device resumes one written on the other.
  at::Device device = at::kCPU;
};

/// Builds the optimizer of a run from the model's named parameters.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(Gpt&)>;
/// Builds how a run steps from the fresh model: the layout of its
/// parameters, gradients, optimizer and checkpoints (muon/distributed/layouts/layout.h).
using LayoutFactory = std::function<std::unique_ptr<muon::distributed::Layout>(Gpt&)>;

/// Sets the learning rates for a step (called before each step with its index).
using LrSetter = std::function<void(int64_t step)>;
/// Builds the LR setter of a run over its fresh optimizer (before a
/// checkpoint is loaded into it, so base learning rates are the configured
/// ones).
using ScheduleFactory = std::function<LrSetter(torch::optim::Optimizer&)>;

/// Trains a fresh model (initialized from `options.seed`, identical on every
/// rank), or the model and optimizer of `options.resume`, up to
/// `options.steps` steps, saving checkpoints as `options` says; returns the
/// log (identical on every rank; after a resume, the checkpoint's points
/// then this run's). Collective over the ranks of `dp` (and, for
/// checkpoints, `options.world`). Raises c10::ValueError on every rank for
/// bad options, a checkpoint that cannot be written or read, or one of
/// another model shape.
RunLog train(const Dataset& data, const TrainOptions& options, const LayoutFactory& make_layout,
             const DataParallel& dp, const ScheduleFactory& make_schedule = nullptr);

/// As above with an optimizer over the model's parameters, replicated over
/// `options.world` (gradients all-reduced over it when it has several
/// ranks; muon::distributed::Layout's constructor for an optimizer built
/// elsewhere), checkpoints of the model's parameters in `options.distributed`.
RunLog train(const Dataset& data, const TrainOptions& options, const OptimizerFactory& make_optimizer,
             const DataParallel& dp, const ScheduleFactory& make_schedule = nullptr);

}  // namespace train_gpt
