// One training run: data-parallel steps, evaluation, checkpoints.
#include "trainer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace train_gpt {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string rank_path(const std::string& path, int64_t rank) {
  return path + ".rank" + std::to_string(rank);
}

at::Tensor log_to_tensor(const RunLog& log) {
  auto t = at::empty({static_cast<int64_t>(log.points.size()), 6}, at::kDouble);
  for (size_t i = 0; i < log.points.size(); ++i) {
    const auto& p = log.points[i];
    const double row[6] = {static_cast<double>(p.step), static_cast<double>(p.tokens),
                           p.train_loss, p.valid_loss, p.seconds, p.optimizer_seconds};
    for (int j = 0; j < 6; ++j) t[static_cast<int64_t>(i)][j] = row[j];
  }
  return t;
}

std::vector<EvalPoint> tensor_to_points(const at::Tensor& t) {
  std::vector<EvalPoint> points;
  const auto a = t.accessor<double, 2>();
  for (int64_t i = 0; i < t.size(0); ++i) {
    points.push_back({static_cast<int64_t>(a[i][0]), static_cast<int64_t>(a[i][1]), a[i][2],
                      a[i][3], a[i][4], a[i][5]});
  }
  return points;
}

// What a checkpoint says about the run that wrote it, checked before
// anything is loaded from it.
struct CheckpointRun {
  int64_t world = 0;
  std::string layout;
  GptConfig model;
};

constexpr const char* kCheckpointFormat = "train_gpt_checkpoint";

void write_run(torch::serialize::OutputArchive& archive, int64_t world, const std::string& layout,
               const GptConfig& model) {
  archive.write(kCheckpointFormat, c10::IValue(int64_t{1}));
  archive.write("world", c10::IValue(world));
  archive.write("layout", c10::IValue(layout));
  archive.write("vocab_size", c10::IValue(model.vocab_size));
  archive.write("context", c10::IValue(model.context));
  archive.write("layers", c10::IValue(model.layers));
  archive.write("heads", c10::IValue(model.heads));
  archive.write("width", c10::IValue(model.width));
  archive.write("mlp_ratio", c10::IValue(model.mlp_ratio));
  archive.write("norm", c10::IValue(model.norm));
}

CheckpointRun read_run(torch::serialize::InputArchive& archive, const std::string& path) {
  c10::IValue v;
  TORCH_CHECK_VALUE(archive.try_read(kCheckpointFormat, v) && v.isInt() && v.toInt() == 1,
                    "[train_gpt] checkpoint ", path,
                    " does not say which run wrote it (not written by this muon-train-gpt); "
                    "start a new run");
  auto integer = [&](const char* key) {
    c10::IValue value;
    archive.read(key, value);
    return value.toInt();
  };
  auto text = [&](const char* key) {
    c10::IValue value;
    archive.read(key, value);
    return value.toStringRef();
  };
  CheckpointRun run;
  run.world = integer("world");
  run.layout = text("layout");
  run.model.vocab_size = integer("vocab_size");
  run.model.context = integer("context");
  run.model.layers = integer("layers");
  run.model.heads = integer("heads");
  run.model.width = integer("width");
  run.model.mlp_ratio = integer("mlp_ratio");
  run.model.norm = text("norm");
  return run;
}

std::string ranks(int64_t n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

// The checkpoint's run against this one, naming the first difference in the
// flags that set it.
void check_run(const CheckpointRun& run, const std::string& path, const TrainOptions& o,
               const GptConfig& model, int64_t world) {
  TORCH_CHECK_VALUE(run.world == world, "[train_gpt] checkpoint ", path, " was written by ",
                    ranks(run.world), " (", run.layout, "), this run has ", world, " (", o.layout,
                    "); resume with --nproc ", run.world);
  TORCH_CHECK_VALUE(run.layout == o.layout, "[train_gpt] checkpoint ", path,
                    " was written with the ", run.layout, " optimizer layout, this run uses ",
                    o.layout, " (--optimizer-layout)");
  const std::pair<const char*, std::pair<int64_t, int64_t>> shape[] = {
      {"--layers", {run.model.layers, model.layers}},
      {"--width", {run.model.width, model.width}},
      {"--heads", {run.model.heads, model.heads}},
      {"--context", {run.model.context, model.context}},
      {"mlp_ratio", {run.model.mlp_ratio, model.mlp_ratio}}};
  for (const auto& [flag, values] : shape) {
    TORCH_CHECK_VALUE(values.first == values.second, "[train_gpt] checkpoint ", path,
                      " was written with ", flag, " ", values.first, ", this run has ", flag, " ",
                      values.second);
  }
  TORCH_CHECK_VALUE(run.model.norm == model.norm, "[train_gpt] checkpoint ", path,
                    " was written with --norm ", run.model.norm, ", this run has --norm ",
                    model.norm);
  TORCH_CHECK_VALUE(run.model.vocab_size == model.vocab_size, "[train_gpt] checkpoint ", path,
                    " was written with a vocabulary of ", run.model.vocab_size,
                    " tokens, this run has ", model.vocab_size,
                    " (the data: --data, --chars, --byte-level)");
}

void save_checkpoint(const std::string& path, Gpt& model, const torch::optim::Optimizer& opt,
                     const RunLog& log, int64_t step, const TrainOptions& o, int64_t world) {
  torch::serialize::OutputArchive archive;
  write_run(archive, world, o.layout, model->config());
  torch::serialize::OutputArchive model_archive(archive.compilation_unit());
  model->save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive opt_archive(archive.compilation_unit());
  opt.save(opt_archive);
  archive.write("optimizer", opt_archive);
  archive.write("step", c10::IValue(step));
  archive.write("log", log_to_tensor(log));
  // A whole file or none: a failed write leaves no partial checkpoint.
  const auto partial = path + ".partial";
  std::error_code error;
  try {
    archive.save_to(partial);
  } catch (...) {
    std::filesystem::remove(partial, error);
    throw;
  }
  std::filesystem::rename(partial, path, error);
  TORCH_CHECK_VALUE(!error, "[train_gpt] cannot write checkpoint ", path, ": ", error.message());
}

int64_t load_checkpoint(const std::string& resume, const TrainOptions& o, int64_t rank,
                        int64_t world, Gpt& model, torch::optim::Optimizer& opt, RunLog& log) {
  const auto path = rank_path(resume, rank);
  if (!std::filesystem::is_regular_file(path)) {
    // Another world size wrote it: rank 0's file says how many ranks.
    const auto first = rank_path(resume, 0);
    TORCH_CHECK_VALUE(rank != 0 && std::filesystem::is_regular_file(first), "[train_gpt] checkpoint ",
                      path, " does not exist (--resume names the directory of a --save)");
    torch::serialize::InputArchive archive;
    archive.load_from(first);
    check_run(read_run(archive, first), first, o, model->config(), world);
    TORCH_CHECK_VALUE(false, "[train_gpt] checkpoint ", path, " does not exist, though ", first,
                      " was written by as many ranks as this run has");
  }
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  check_run(read_run(archive, path), path, o, model->config(), world);
  torch::serialize::InputArchive model_archive;
  archive.read("model", model_archive);
  model->load(model_archive);
  torch::serialize::InputArchive opt_archive;
  archive.read("optimizer", opt_archive);
  opt.load(opt_archive);
  c10::IValue step;
  archive.read("step", step);
  at::Tensor points;
  archive.read("log", points);
  log.points = tensor_to_points(points);
  return step.toInt();
}

}  // namespace

RunLog train(const Dataset& data, const TrainOptions& o, const OptimizerFactory& make_optimizer,
             const DataParallel& dp, const ScheduleFactory& make_schedule) {
  TORCH_CHECK_VALUE(o.steps >= 1, "[train_gpt] steps must be >= 1, got ", o.steps);
  TORCH_CHECK_VALUE(o.eval_every >= 1, "[train_gpt] eval_every must be >= 1, got ", o.eval_every);
  TORCH_CHECK_VALUE(o.global_batch >= dp.world && o.global_batch % dp.world == 0,
                    "[train_gpt] global_batch ", o.global_batch,
                    " must be a positive multiple of the world size ", dp.world);
  at::manual_seed(o.seed);
  GptConfig config = o.model;
  config.vocab_size = data.vocab.size();
  Gpt model(config);
  auto opt = make_optimizer(model);
  const LrSetter before_step = make_schedule ? make_schedule(*opt) : nullptr;
  RunLog log{o.name, {}};

  // Validation windows are split over the ranks; losses are summed back.
  const auto windows = valid_windows(data.valid, o.eval_windows, config.context);
  const auto mine = at::arange(dp.rank, windows.size(0), dp.world);
  const auto local_windows = windows.index_select(0, mine);
  auto evaluate = [&]() {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> sum{at::zeros({1}, at::kDouble)};
    if (local_windows.size(0) > 0) {
      sum[0] += model->loss(local_windows).item<double>() * static_cast<double>(local_windows.size(0));
    }
    dp.all_reduce_sum(sum);
    return sum[0].item<double>() / static_cast<double>(windows.size(0));
  };

  int64_t start = 0;
  if (!o.resume.empty()) {
    std::string error;
    try {
      start = load_checkpoint(o.resume, o, dp.rank, dp.world, model, *opt, log);
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    }
    // Every rank learns whether every rank loaded: a rank that could not
    // would otherwise leave the others waiting in the first collective.
    std::vector<at::Tensor> failed{at::full({1}, error.empty() ? 0.0 : 1.0, at::kDouble)};
    dp.all_reduce_sum(failed);
    TORCH_CHECK_VALUE(error.empty(), error);
    TORCH_CHECK_VALUE(failed[0].item<double>() == 0.0, "[train_gpt] run '", o.name,
                      "': another rank could not load its checkpoint from ", o.resume,
                      ".rank<r> (its message says why)");
    log.name = o.name;
    TORCH_CHECK_VALUE(start <= o.steps, "[train_gpt] the checkpoint is at step ", start,
                      ", past steps ", o.steps);
  } else {
    log.points.push_back({0, 0, std::numeric_limits<double>::quiet_NaN(), evaluate(), 0, 0});
  }
  const int64_t tokens_per_step = o.global_batch * config.context;
  const double start_seconds = log.points.back().seconds;
  double seconds = start_seconds;
  double opt_seconds = log.points.back().optimizer_seconds;
  double train_sum = 0;
  int64_t train_count = 0;
  const bool show = o.progress && dp.rank == 0;
  ProgressBar bar(o.name, o.steps);
  for (int64_t step = start; step < o.steps; ++step) {
    const auto t0 = Clock::now();
    if (before_step) before_step(step);
    const auto batch =
        train_batch(data.train, step, o.global_batch, config.context, dp.rank, dp.world, o.seed);
    opt->zero_grad();
    auto loss = model->loss(batch);
    loss.backward();
    dp.average_gradients(model->parameters());
    const auto t_opt = Clock::now();
    opt->step();
    opt_seconds += since(t_opt);
    seconds += since(t0);
    const double loss_value = loss.item<double>();
    TORCH_CHECK(std::isfinite(loss_value), "[train_gpt] run '", o.name,
                "': the training loss is ", loss_value, " at step ", step);
    train_sum += loss_value;
    ++train_count;
    const int64_t done = step + 1;
    if (done % o.eval_every == 0 || done == o.steps) {
      std::vector<at::Tensor> mean{at::tensor({train_sum, static_cast<double>(train_count)}, at::kDouble)};
      dp.all_reduce_sum(mean);
      const double train_loss = mean[0][0].item<double>() / mean[0][1].item<double>();
      log.points.push_back({done, done * tokens_per_step, train_loss, evaluate(), seconds, opt_seconds});
      train_sum = 0;
      train_count = 0;
    }
    if (show) {
      bar.update(done, loss_value, static_cast<double>((done - start) * tokens_per_step) /
                                       std::max(seconds - start_seconds, 1e-9));
    }
  }
  if (show) bar.finish();
  if (!o.save_checkpoint.empty()) {
    save_checkpoint(rank_path(o.save_checkpoint, dp.rank), model, *opt, log, o.steps, o, dp.world);
  }
  if (!o.out_dir.empty() && dp.rank == 0) write_csv(log, o.out_dir + "/" + o.name + ".csv");
  return log;
}

}  // namespace train_gpt
