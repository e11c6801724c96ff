// One training run: data-parallel steps, evaluation, checkpoints.
#include "trainer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_run.h"
#include "device.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/distributed/layouts/qk_clip.h"
#include "muon/optim/state_bytes.h"

namespace train_gpt {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// `values` as a float64 tensor on `device`: what the run sums over the
// ranks (NCCL takes CUDA tensors only).
at::Tensor doubles(const std::vector<double>& values, const at::Device& device) {
  return at::tensor(values, at::kDouble).to(device);
}

// The element-wise MAX of `values` over the ranks of `world`, on the CPU, in
// float64. As muon::distributed::all_reduce_max, whose gather takes CPU tensors
// (Gloo's): here the tensors go through `device`, NCCL's on CUDA.
at::Tensor max_over(const at::Tensor& values, const muon::distributed::Group& world,
                    const at::Device& device) {
  auto local = values.detach().to(device, at::kDouble).contiguous();
  if (world.size() > 1) {
    // at::maximum propagates NaN: a NaN on any rank is seen by every rank.
    for (const auto& other : world.all_gather(local)) local = at::maximum(local, other);
  }
  return local.to(at::kCPU);
}

std::string ranks(int64_t n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

// Raises `error` on this rank, or a message naming what failed on another
// rank, on every rank when any rank failed: a rank that could not go on
// would otherwise leave the others waiting in the next collective.
void agree(const DataParallel& dp, const at::Device& device, const std::string& error,
           const std::string& elsewhere) {
  std::vector<at::Tensor> failed{doubles({error.empty() ? 0.0 : 1.0}, device)};
  dp.all_reduce_sum(failed);
  TORCH_CHECK_VALUE(error.empty(), error);
  TORCH_CHECK_VALUE(failed[0].item<double>() == 0.0, elsewhere);
}

void check_options(const TrainOptions& o, const DataParallel& dp) {
  TORCH_CHECK_VALUE(o.steps >= 1, "[train_gpt] steps must be >= 1, got ", o.steps);
  TORCH_CHECK_VALUE(o.eval_every >= 1, "[train_gpt] eval_every must be >= 1, got ", o.eval_every);
  TORCH_CHECK_VALUE(o.global_batch >= dp.world && o.global_batch % dp.world == 0,
                    "[train_gpt] global_batch ", o.global_batch,
                    " must be a positive multiple of the world size ", dp.world);
  TORCH_CHECK_VALUE(o.save_every >= 0, "[train_gpt] save_every must be >= 0, got ", o.save_every);
  TORCH_CHECK_VALUE(o.keep >= 1, "[train_gpt] keep must be >= 1, got ", o.keep);
  TORCH_CHECK_VALUE(std::isfinite(o.qk_clip) && o.qk_clip >= 0,
                    "[train_gpt] qk_clip must be finite and >= 0 (0: off), got ", o.qk_clip);
}

// The largest attention logits of the steps (QK-clip, TrainOptions::qk_clip):
// each step's maxima per block and head, the MAX over every rank, the clip
// after the step, and what the log points print.
class MaxLogits {
 public:
  MaxLogits(const TrainOptions& o, const GptConfig& config, const muon::distributed::Group& world)
      : o_(o), config_(config), world_(world) {}

  bool active() const { return o_.qk_clip > 0 || o_.log_max_logits; }

  // After the optimizer's step: this step's maxima over every rank, then
  // the clip of every block's fused QKV weight.
  void after_step(Gpt& model, muon::distributed::Layout& layout) {
    if (!active()) return;
    const auto local = model->max_logits();
    // One MAX over every rank for all blocks (data-parallel ranks saw other
    // rows; tensor-parallel ranks hold other heads, −∞ in theirs).
    step_ = max_over(at::stack(local), world_, o_.device);
    interval_ = interval_.defined() ? at::maximum(interval_, step_) : step_.clone();
    if (o_.qk_clip <= 0) return;
    const auto options =
        muon::QkClipOptions(config_.heads, config_.width / config_.heads).threshold(o_.qk_clip);
    for (int64_t b = 0; b < config_.layers; ++b) {
      const auto gamma = muon::distributed::qk_clip_(layout,
                                              {{"blocks." + std::to_string(b) + ".attn.qkv.weight",
                                                muon::QkvRows::kGrouped, model->qkv_row_begin()}},
                                              step_[b], options);
      clipped_ += (gamma < 1.0).sum().item<int64_t>();
    }
  }

  // The line of a log point (rank 0).
  void print(int64_t step) {
    if (!active() || !step_.defined()) return;
    if (world_.rank() == 0) {
      std::string per_block;
      for (int64_t b = 0; b < config_.layers; ++b) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.2f", b ? " " : "", step_[b].max().item<double>());
        per_block += buf;
      }
      std::printf("run '%s' step %lld: max attention logit per block %s; since the last point %.2f",
                  o_.name.c_str(), static_cast<long long>(step), per_block.c_str(),
                  interval_.max().item<double>());
      if (o_.qk_clip > 0) {
        std::printf(" (qk-clip %g: %lld head clips)", o_.qk_clip, static_cast<long long>(clipped_));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    interval_ = at::Tensor();
    clipped_ = 0;
  }

 private:
  const TrainOptions& o_;
  const GptConfig& config_;
  muon::distributed::Group world_;
  at::Tensor step_;      // (layers, heads): the last step's maxima
  at::Tensor interval_;  // the largest since the last log point
  int64_t clipped_ = 0;  // heads clipped since the last log point
};

// The validation loss: the windows are split over the ranks; losses are
// summed back.
class Validation {
 public:
  Validation(const at::Tensor& valid, int64_t count, int64_t context, const DataParallel& dp,
             const at::Device& device)
      : dp_(dp),
        device_(device),
        windows_(valid_windows(valid, count, context)),
        local_windows_(windows_.index_select(0, at::arange(dp.rank, windows_.size(0), dp.world))
                           .to(device)) {}

  double loss(Gpt& model) const {
    at::NoGradGuard no_grad;
    double local = 0;
    if (local_windows_.size(0) > 0) {
      const auto n = static_cast<double>(local_windows_.size(0));
      local = model->loss(local_windows_).item<double>() * n;
    }
    std::vector<at::Tensor> sum{doubles({local}, device_)};
    dp_.all_reduce_sum(sum);
    return sum[0].item<double>() / static_cast<double>(windows_.size(0));
  }

 private:
  const DataParallel& dp_;
  at::Device device_;
  at::Tensor windows_;
  at::Tensor local_windows_;
};

// Where a run stands: its first step (0, or the checkpoint's it resumed
// from) and the totals a checkpoint carries on.
struct Progress {
  int64_t start = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double opt_seconds = 0;
  // Training losses since the last log point: this rank's sum, and the steps.
  double train_sum = 0;
  int64_t train_count = 0;
};

// Appends the log point of `step` and starts the next interval's training
// losses.
void add_point(RunLog& log, Progress& p, int64_t step, double train_loss, double valid_loss) {
  log.points.push_back({step, p.tokens, train_loss, valid_loss, p.seconds, p.opt_seconds});
  p.train_sum = 0;
  p.train_count = 0;
}

// Resumes from the newest checkpoint in o.resume: the model and optimizer
// state, and the log and totals of the run that wrote it. Every rank reads
// the manifest and checks the model before the collective load, so that a
// checkpoint of another model is named by its flag rather than by a
// parameter's shape.
Progress resume(const TrainOptions& o, const DataParallel& dp, const muon::distributed::Group& world,
                const GptConfig& config, muon::distributed::Layout& layout,
                const muon::distributed::CheckpointOptions& checkpoint_options, const Validation& validation,
                Gpt& model, RunLog& log) {
  std::string error;
  std::string path;
  CheckpointRun run;
  try {
    const auto info = muon::distributed::latest_checkpoint(o.resume);
    TORCH_CHECK_VALUE(info.has_value(), "[train_gpt] run '", o.name, "': '", o.resume,
                      "' holds no complete checkpoint to resume from");
    path = info->path;
    run = run_from_json(info->extra, path);
    check_model(run.model, path, config);
    TORCH_CHECK_VALUE(info->step <= o.steps, "[train_gpt] checkpoint ", path, " is at step ",
                      info->step, ", past this run's steps ", o.steps);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  agree(dp, o.device, error,
        "[train_gpt] run '" + o.name + "': another rank could not resume from " + o.resume +
            " (its message says why)");
  const auto info = muon::distributed::load_checkpoint(path, layout, checkpoint_options);
  Progress p{info.step, run.tokens, run.seconds, run.optimizer_seconds, run.train_loss_sum, run.train_steps};
  log.points = run.points;
  // The loaded model is the saved one: where the checkpoint's step is a log
  // point, its validation loss again (equal up to the rounding of another
  // world size or layout).
  const bool at_log_point = !log.points.empty() && log.points.back().step == p.start;
  const double again = at_log_point ? validation.loss(model) : 0.0;
  if (world.rank() == 0) {
    // The devices where their kinds differ (CUDA to CPU or back: the
    // checkpoint's tensors are CPU tensors, loaded onto this run's device).
    const auto kind = run.device.substr(0, run.device.find(':'));
    const bool moved = !kind.empty() && kind != c10::DeviceTypeName(o.device.type(), true);
    const std::string theirs = moved ? ", on " + run.device : "";
    const std::string ours = moved ? ", on " + o.device.str() : "";
    std::printf(
        "run '%s': resumed from step %lld of %s (written by %s, %s%s; this run: %s, %s%s)\n",
                o.name.c_str(), static_cast<long long>(p.start), info.path.c_str(),
                ranks(run.world).c_str(), run.layout.c_str(), theirs.c_str(),
                ranks(world.size()).c_str(), o.layout.c_str(), ours.c_str());
    if (at_log_point) {
      std::printf("run '%s': val loss at step %lld: %.6f in the checkpoint's log, %.6f evaluated after loading\n",
                  o.name.c_str(), static_cast<long long>(p.start), log.points.back().valid_loss, again);
    }
    std::fflush(stdout);
  }
  return p;
}

// The run's world (TrainOptions::world), checked against the ranks of `dp`
// and `tp` where the run uses it.
muon::distributed::Group run_world(const TrainOptions& o, const DataParallel& dp, const muon::distributed::Group& tp) {
  const auto world = o.world.valid()               ? o.world
                     : o.distributed.group.valid() ? o.distributed.group
                                                   : muon::distributed::Group::single();
  const bool checkpoints = !o.save_dir.empty() || !o.resume.empty();
  TORCH_CHECK_VALUE(!checkpoints || world.size() == dp.world * tp.size(),
                    "[train_gpt] checkpoints are saved and loaded over TrainOptions::world (",
                    world.size(), " ranks), but this run has ", dp.world,
                    " data-parallel × ", tp.size(), " tensor-parallel ranks; give the world group");
  TORCH_CHECK_VALUE(!(o.qk_clip > 0 || o.log_max_logits) || world.size() == dp.world * tp.size(),
                    "[train_gpt] qk_clip takes the maxima over TrainOptions::world (", world.size(),
                    " ranks), but this run has ", dp.world, " data-parallel × ", tp.size(),
                    " tensor-parallel ranks; give the world group");
  return world;
}

// The mean training loss of the steps since the last log point over the
// ranks (each rank's steps count).
double interval_train_loss(const Progress& p, const DataParallel& dp, const at::Device& device) {
  std::vector<at::Tensor> mean{doubles({p.train_sum, static_cast<double>(p.train_count)}, device)};
  dp.all_reduce_sum(mean);
  const auto sums = mean[0].cpu();
  return sums[0].item<double>() / sums[1].item<double>();
}

// Saves checkpoint `step` of the run with its log and what is needed to
// continue it in the manifest. Collective.
void save_run(const TrainOptions& o, const DataParallel& dp, const muon::distributed::Group& world,
              const GptConfig& config, const muon::distributed::CheckpointOptions& checkpoint_options,
              muon::distributed::Layout& layout, const RunLog& log, const Progress& p, int64_t step) {
  CheckpointRun run{config,   o.layout,  world.size(),  o.device.str(), log.points,
                    p.tokens, p.seconds, p.opt_seconds, 0,              p.train_count};
  if (p.train_count > 0) {
    // Each step's loss as the mean over the ranks, so that a run resumed
    // at any world size completes the interval's mean.
    std::vector<at::Tensor> sum{doubles({p.train_sum}, o.device)};
    dp.all_reduce_sum(sum);
    run.train_loss_sum = sum[0].item<double>() / static_cast<double>(dp.world);
  }
  muon::distributed::save_checkpoint(o.save_dir, layout, step, run_to_json(run), checkpoint_options);
}

// The layout's cost on the most loaded rank.
void measure_cost(RunLog& log, const muon::distributed::Layout& layout, Gpt& model, const muon::distributed::Group& world,
                  int64_t steps_taken, int64_t step_bytes) {
  int64_t parameter_bytes = layout.extra_parameter_bytes();
  for (const auto& p : model->parameters()) parameter_bytes += p.numel() * p.element_size();
  const auto costs = world.all_gather_ints({layout.state_bytes(), parameter_bytes,
                                            steps_taken > 0 ? step_bytes / steps_taken : 0});
  for (const auto& c : costs) {
    log.cost.optimizer_state_bytes = std::max(log.cost.optimizer_state_bytes, c[0]);
    log.cost.parameter_bytes = std::max(log.cost.parameter_bytes, c[1]);
    log.cost.bytes_sent_per_step = std::max(log.cost.bytes_sent_per_step, c[2]);
  }
}

}  // namespace

RunLog train(const Dataset& data, const TrainOptions& o, const OptimizerFactory& make_optimizer,
             const DataParallel& dp, const ScheduleFactory& make_schedule) {
  auto factory = [&](Gpt& model) {
    const auto world = o.world.valid() ? o.world : muon::distributed::Group::single();
    return std::make_unique<muon::distributed::Layout>(model->named_parameters(), make_optimizer(model),
                                                muon::distributed::LayoutGroups().world(world), o.distributed);
  };
  return train(data, o, LayoutFactory(factory), dp, make_schedule);
}

RunLog train(const Dataset& data, const TrainOptions& o, const LayoutFactory& make_layout,
             const DataParallel& dp, const ScheduleFactory& make_schedule) {
  check_options(o, dp);
  const auto tp = o.tensor_parallel.valid() ? o.tensor_parallel : muon::distributed::Group::single();
  const auto world = run_world(o, dp, tp);
  const auto checkpoint_options = muon::distributed::CheckpointOptions().group(world).keep(o.keep);
  at::manual_seed(o.seed);
  GptConfig config = o.model;
  config.vocab_size = data.vocab.size();
  Gpt model(config, tp);
  model->to(o.device);  // initialized on the CPU: the same values on every device
  const auto layout = make_layout(model);
  const LrSetter before_step = make_schedule ? make_schedule(layout->optimizer()) : nullptr;
  RunLog log{o.name, {}, {}};
  const Validation validation(data.valid, o.eval_windows, config.context, dp, o.device);

  Progress p;
  if (!o.resume.empty()) {
    p = resume(o, dp, world, config, *layout, checkpoint_options, validation, model, log);
  } else {
    log.points.push_back({0, 0, std::numeric_limits<double>::quiet_NaN(), validation.loss(model), 0, 0});
  }

  auto save = [&](int64_t step) {
    save_run(o, dp, world, config, checkpoint_options, *layout, log, p, step);
  };
  const int64_t tokens_per_step = o.global_batch * config.context;
  const double start_seconds = p.seconds;
  const bool show = o.progress && world.rank() == 0;
  ProgressBar bar(o.name, o.steps);
  auto bytes_sent = [&] {
    int64_t n = 0;
    for (const auto& g : o.counted_groups) n += g.bytes_sent();
    return n;
  };
  int64_t step_bytes = 0;
  MaxLogits max_logits(o, config, world);
  for (int64_t step = p.start; step < o.steps; ++step) {
    // CUDA queues its work: the clocks are read when the device is done.
    synchronize(o.device);
    const auto t0 = Clock::now();
    const int64_t bytes0 = bytes_sent();
    if (before_step) before_step(step);
    const auto batch =
        train_batch(data.train, step, o.global_batch, config.context, dp.rank, dp.world, o.seed)
            .to(o.device);
    layout->zero_grad();
    auto loss = model->loss(batch);
    loss.backward();
    // The step's agreement and the gradients' reduction (all-reduce or
    // reduce-scatter) are timed apart from the optimizer's step (DDP and
    // FSDP overlap them with backward); so is the ranks' skew, which the
    // first collective absorbs.
    layout->reduce_gradients();
    synchronize(o.device);
    const auto t_opt = Clock::now();
    layout->step();
    max_logits.after_step(model, *layout);
    synchronize(o.device);
    p.opt_seconds += since(t_opt);
    p.seconds += since(t0);
    step_bytes += bytes_sent() - bytes0;
    p.tokens += tokens_per_step;
    const double loss_value = loss.item<double>();
    TORCH_CHECK(std::isfinite(loss_value), "[train_gpt] run '", o.name,
                "': the training loss is ", loss_value, " at step ", step);
    p.train_sum += loss_value;
    ++p.train_count;
    const int64_t done = step + 1;
    if (done % o.eval_every == 0 || done == o.steps) {
      const double train_loss = interval_train_loss(p, dp, o.device);
      add_point(log, p, done, train_loss, validation.loss(model));
      max_logits.print(done);
    }
    if (!o.save_dir.empty() &&
        (done == o.steps || (o.save_every > 0 && done % o.save_every == 0))) {
      save(done);
    }
    if (show) {
      bar.update(done, loss_value, static_cast<double>((done - p.start) * tokens_per_step) /
                                       std::max(p.seconds - start_seconds, 1e-9));
    }
  }
  if (show) bar.finish();
  if (p.start == o.steps) {
    // Resumed at its last step: no step to take. The log ends at the last
    // step (the checkpoint's may end before, at its last evaluation) and the
    // checkpoint is saved all the same.
    if (log.points.back().step < o.steps) {
      const double train_loss = p.train_count > 0 ? p.train_sum / static_cast<double>(p.train_count)
                                                  : std::numeric_limits<double>::quiet_NaN();
      add_point(log, p, o.steps, train_loss, validation.loss(model));
    }
    if (!o.save_dir.empty()) save(o.steps);
  }
  measure_cost(log, *layout, model, world, o.steps - p.start, step_bytes);
  if (!o.out_dir.empty() && world.rank() == 0) write_csv(log, o.out_dir + "/" + o.name + ".csv");
  return log;
}

}  // namespace train_gpt
