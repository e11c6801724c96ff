// CSV logs and the comparison table.
#include "report.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

namespace train_gpt {

const EvalPoint& RunLog::final_point() const {
  TORCH_CHECK_VALUE(!points.empty(), "[train_gpt] run '", name, "' has no evaluation point");
  return points.back();
}

double RunLog::seconds_per_step() const {
  const auto& last = final_point();
  return last.step > 0 ? last.seconds / static_cast<double>(last.step) : 0.0;
}

double RunLog::optimizer_seconds_per_step() const {
  const auto& last = final_point();
  return last.step > 0 ? last.optimizer_seconds / static_cast<double>(last.step) : 0.0;
}

double RunLog::optimizer_share() const {
  const auto& last = final_point();
  return last.seconds > 0 ? last.optimizer_seconds / last.seconds : 0.0;
}

double RunLog::steps_to_reach(double target) const {
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].valid_loss > target) continue;
    if (i == 0) return static_cast<double>(points[0].step);
    const auto& a = points[i - 1];
    const auto& b = points[i];
    const double f = (a.valid_loss - target) / (a.valid_loss - b.valid_loss);
    return static_cast<double>(a.step) + f * static_cast<double>(b.step - a.step);
  }
  return -1;
}

void write_csv(const RunLog& log, const std::string& path) {
  std::ofstream out(path);
  TORCH_CHECK(out.good(), "[train_gpt] cannot write '", path, "'");
  out << "step,tokens,train_loss,valid_loss,seconds,optimizer_seconds\n";
  out << std::setprecision(9);
  for (const auto& p : log.points) {
    out << p.step << ',' << p.tokens << ',' << p.train_loss << ',' << p.valid_loss << ','
        << p.seconds << ',' << p.optimizer_seconds << '\n';
  }
  TORCH_CHECK(out.good(), "[train_gpt] writing '", path, "' failed");
}

RunLog read_csv(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK_VALUE(in.good(), "[train_gpt] cannot read '", path, "'");
  RunLog log;
  const auto slash = path.find_last_of('/');
  log.name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  log.name = log.name.substr(0, log.name.rfind('.'));
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream row(line);
    EvalPoint p;
    char comma = 0;
    std::string train;
    row >> p.step >> comma >> p.tokens >> comma;
    std::getline(row, train, ',');
    p.train_loss = train == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::stod(train);
    row >> p.valid_loss >> comma >> p.seconds >> comma >> p.optimizer_seconds;
    TORCH_CHECK_VALUE(!row.fail(), "[train_gpt] malformed line in '", path, "': ", line);
    log.points.push_back(p);
  }
  return log;
}

std::string format_bytes(int64_t n) {
  char text[32];
  if (n >= (int64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(n) / (1 << 20));
  } else {
    std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(n) / 1024);
  }
  return text;
}

std::string comparison_table(const std::vector<RunLog>& runs, size_t baseline,
                             const std::string& device) {
  TORCH_CHECK_VALUE(baseline < runs.size(), "[train_gpt] baseline ", baseline, " of ",
                    runs.size(), " runs");
  const double target = runs[baseline].final_point().valid_loss;
  const double base_steps = runs[baseline].steps_to_reach(target);
  int width = 10;  // the name column fits the longest name
  for (const auto& run : runs) width = std::max(width, static_cast<int>(run.name.size()));
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "%-*s %10s %12s %10s %12s %26s\n", width, "run", "val loss",
                "ms/step", "opt share", "state/rank", "steps to baseline's loss");
  out << line;
  for (const auto& run : runs) {
    const double s = run.steps_to_reach(target);
    char reach[64];
    if (s < 0) {
      std::snprintf(reach, sizeof reach, "not reached");
    } else {
      std::snprintf(reach, sizeof reach, "%.0f (%.2fx)", s, base_steps > 0 ? s / base_steps : 0.0);
    }
    const auto state = run.cost.optimizer_state_bytes > 0 ? format_bytes(run.cost.optimizer_state_bytes)
                                                          : std::string("-");
    std::snprintf(line, sizeof line, "%-*s %10.4f %12.1f %9.1f%% %12s %26s\n", width,
                  run.name.c_str(), run.final_point().valid_loss, 1000 * run.seconds_per_step(),
                  100 * run.optimizer_share(), state.c_str(), reach);
    out << line;
  }
  if (!device.empty()) out << "device: " << device << "\n";
  return out.str();
}

}  // namespace train_gpt
