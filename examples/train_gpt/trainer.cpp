// One training run: data-parallel steps, evaluation, checkpoints.
#include "trainer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

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

void save_checkpoint(const std::string& path, Gpt& model, const torch::optim::Optimizer& opt,
                     const RunLog& log, int64_t step) {
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive(archive.compilation_unit());
  model->save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive opt_archive(archive.compilation_unit());
  opt.save(opt_archive);
  archive.write("optimizer", opt_archive);
  archive.write("step", c10::IValue(step));
  archive.write("log", log_to_tensor(log));
  archive.save_to(path);
}

int64_t load_checkpoint(const std::string& path, Gpt& model, torch::optim::Optimizer& opt,
                        RunLog& log) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
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
    start = load_checkpoint(rank_path(o.resume, dp.rank), model, *opt, log);
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
    save_checkpoint(rank_path(o.save_checkpoint, dp.rank), model, *opt, log, o.steps);
  }
  if (!o.out_dir.empty() && dp.rank == 0) write_csv(log, o.out_dir + "/" + o.name + ".csv");
  return log;
}

}  // namespace train_gpt
