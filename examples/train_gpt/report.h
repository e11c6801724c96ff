#pragma once

/// What a training run records, and the comparison printed at the end: a CSV
/// log per run, a table, and how many steps one run needs to reach another's
/// final validation loss.
#include <cstdint>
#include <string>
#include <vector>

namespace train_gpt {

/// One evaluation point of a run.
struct EvalPoint {
  /// Optimizer steps taken before the evaluation.
  int64_t step = 0;
  /// Tokens trained on (all ranks) before the evaluation.
  int64_t tokens = 0;
  /// Mean training loss since the previous evaluation (NaN at step 0).
  double train_loss = 0;
  /// Validation loss.
  double valid_loss = 0;
  /// Training wall time so far, seconds (evaluations excluded).
  double seconds = 0;
  /// Of which spent in optimizer.step(), seconds.
  double optimizer_seconds = 0;
};

/// What a run's layout costs each rank: the largest over the ranks.
struct RankCost {
  /// Bytes of the optimizer's state.
  int64_t optimizer_state_bytes = 0;
  /// Bytes of the parameters held (the model's, and master shards).
  int64_t parameter_bytes = 0;
  /// Bytes sent per training step (forward, backward and optimizer step),
  /// by the ring model of muon::distributed::Group::bytes_sent.
  int64_t bytes_sent_per_step = 0;
};

/// A finished run.
struct RunLog {
  /// Its name ("muon", "adamw", ...).
  std::string name;
  /// Its evaluation points, in step order.
  std::vector<EvalPoint> points;
  /// Per-rank cost of the layout (not in the CSV).
  RankCost cost;

  /// The last point (the run must have one).
  const EvalPoint& final_point() const;
  /// Mean wall time per step, seconds.
  double seconds_per_step() const;
  /// Mean time per step in the layout's step (the optimizer, and a
  /// reduce-scatter of the gradients where the layout does one), seconds.
  double optimizer_seconds_per_step() const;
  /// Fraction of training time spent in optimizer.step().
  double optimizer_share() const;
  /// The first step at which the validation loss is <= `target`, linearly
  /// interpolated between evaluation points; -1 when never reached.
  double steps_to_reach(double target) const;
};

/// Writes `log` as CSV (header: step,tokens,train_loss,valid_loss,seconds,optimizer_seconds).
void write_csv(const RunLog& log, const std::string& path);
/// Reads a CSV written by write_csv (the name is the file's stem).
RunLog read_csv(const std::string& path);

/// `n` bytes in KiB (below 1 MiB) or MiB, e.g. "1.25 MiB".
std::string format_bytes(int64_t n);

/// The comparison table of `runs`: final validation loss, time per step,
/// optimizer share of step time, optimizer state bytes per rank (the
/// largest over the ranks; "-" for a run read back from its CSV, which does
/// not hold it), and steps to reach the final validation loss of
/// `runs[baseline]` (with the ratio to the baseline's steps); then, when
/// `device` is not empty, a line saying where the runs computed ("device:
/// cuda:0 (NVIDIA H100 80GB HBM3)").
std::string comparison_table(const std::vector<RunLog>& runs, size_t baseline,
                             const std::string& device = "");

}  // namespace train_gpt
