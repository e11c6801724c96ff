#pragma once

/// A one-line progress bar: step, loss, tokens/s and ETA, redrawn in place
/// on a terminal and printed every few percent otherwise (logs, pipes).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace train_gpt {

/// Progress of one run of `total` steps, written to `out`.
class ProgressBar {
 public:
  /// A bar labelled `label`; redraws in place when `out` is a terminal.
  ProgressBar(std::string label, int64_t total, std::FILE* out = stderr);
  /// Reports that `step` steps are done, with the latest loss and throughput.
  void update(int64_t step, double loss, double tokens_per_second);
  /// Ends the line.
  void finish();

 private:
  std::string label_;
  int64_t total_;
  std::FILE* out_;
  bool tty_;
  int64_t last_printed_percent_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace train_gpt
