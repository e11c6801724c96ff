#pragma once

/// muon-train-gpt --compare-layouts: the same runs in every layout of
/// --parallel at several rank counts, each a separate job of this program,
/// compared in one table (final validation loss and its difference from
/// one process, optimizer state and parameter bytes per rank, bytes sent per
/// rank per step, ms per step).
#include <cstdint>
#include <string>
#include <vector>

#include "report.h"

namespace train_gpt {

/// Writes the runs' final validation losses and costs as JSON to `path`
/// (--summary; what compare_layouts reads back): {"parallel", "ranks",
/// "device", "runs": [{"name", "valid_loss", "ms_per_step",
/// "optimizer_state_bytes", "parameter_bytes", "bytes_sent_per_step"}]};
/// `device` is where the ranks computed (train_gpt::describe_devices:
/// "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)", ...). Raises c10::ValueError
/// when it cannot be written.
void write_summary(const std::string& path, const std::string& parallel, int ranks,
                   const std::vector<RunLog>& logs, const std::string& device = "cpu");

/// One job of the comparison.
struct LayoutJob {
  /// --parallel value.
  std::string parallel;
  /// Ranks (--nproc).
  int ranks = 1;
  /// Tensor-parallel ranks (--tp; 0: the layout's default).
  int tp = 0;
  /// A name for files: "tp_sharded-4".
  std::string label() const;
};

/// The jobs: one process, then at each of `ranks` every layout the model
/// divides into (tensor parallelism needs at least as many heads as ranks;
/// the 2-D layout runs at 4 or more ranks, --tp 2).
std::vector<LayoutJob> layout_jobs(const std::vector<int>& ranks, int64_t heads);

/// Runs each job as `program args --nproc N --parallel P [--tp T]` with its
/// own output directory and summary under `out_dir`, its output in
/// `<out_dir>/<label>.log`; prints a line per job as it ends, then the table
/// and the device of the jobs.
/// Returns 0, or 1 when a job failed (its log's last lines printed).
int compare_layouts(const std::string& program, const std::vector<std::string>& args,
                    const std::string& out_dir, const std::vector<LayoutJob>& jobs);

}  // namespace train_gpt
