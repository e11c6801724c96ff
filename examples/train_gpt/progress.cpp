// The progress bar.
#include "progress.h"

#include <unistd.h>

#include <algorithm>

namespace train_gpt {

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      out_(out),
      tty_(isatty(fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(int64_t step, double loss, double tokens_per_second) {
  const int64_t percent = 100 * step / total_;
  // Off a terminal, print a line every 10%.
  if (!tty_ && percent / 10 == last_printed_percent_ / 10 && step != total_) return;
  last_printed_percent_ = percent;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = step > 0 ? elapsed * static_cast<double>(total_ - step) / static_cast<double>(step) : 0;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(kWidth * step / total_);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(out_, "%s%-6s [%s] %3lld%% step %lld/%lld loss %.4f %7.0f tok/s ETA %4.0fs%s",
               tty_ ? "\r" : "", label_.c_str(), bar.c_str(), static_cast<long long>(percent),
               static_cast<long long>(step), static_cast<long long>(total_), loss,
               tokens_per_second, eta, tty_ ? "" : "\n");
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace train_gpt
