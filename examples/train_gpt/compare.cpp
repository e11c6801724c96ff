// --compare-layouts: every layout as its own job, one table.
#include "compare.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace train_gpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A single-quoted shell word.
std::string quote(const std::string& word) {
  std::string out = "'";
  for (const char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The last `n` lines of a file.
std::string tail(const std::string& path, size_t n) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > n) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += "    " + l + "\n";
  return out;
}

}  // namespace

void write_summary(const std::string& path, const std::string& parallel, int ranks,
                   const std::vector<RunLog>& logs, const std::string& device) {
  json runs = json::array();
  for (const auto& l : logs) {
    runs.push_back({{"name", l.name},
                    {"valid_loss", l.final_point().valid_loss},
                    {"ms_per_step", 1e3 * l.seconds_per_step()},
                    {"optimizer_ms_per_step", 1e3 * l.optimizer_seconds_per_step()},
                    {"optimizer_state_bytes", l.cost.optimizer_state_bytes},
                    {"parameter_bytes", l.cost.parameter_bytes},
                    {"bytes_sent_per_step", l.cost.bytes_sent_per_step}});
  }
  std::ofstream out(path);
  out << json{{"parallel", parallel}, {"ranks", ranks}, {"device", device}, {"runs", runs}}.dump()
      << "\n";
  TORCH_CHECK_VALUE(out.good(), "[muon-train-gpt] --summary '", path.substr(0, 200),
                    "': cannot write it");
}

std::string LayoutJob::label() const {
  std::string name = parallel;
  for (auto& c : name) {
    if (c == ',') c = '_';
  }
  return name + "-" + std::to_string(ranks);
}

std::vector<LayoutJob> layout_jobs(const std::vector<int>& ranks, int64_t heads) {
  std::vector<LayoutJob> jobs{{"single", 1, 0}};
  for (const int n : ranks) {
    if (n < 2) continue;
    jobs.push_back({"ddp", n, 0});
    jobs.push_back({"sharded", n, 0});
    if (heads >= n) jobs.push_back({"tp", n, n});
    if (n >= 4 && n % 2 == 0 && heads >= 2) jobs.push_back({"tp,sharded", n, 2});
  }
  return jobs;
}

int compare_layouts(const std::string& program, const std::vector<std::string>& args,
                    const std::string& out_dir, const std::vector<LayoutJob>& jobs) {
  fs::create_directories(out_dir);
  struct Row {
    LayoutJob job;
    json run;
  };
  std::vector<Row> rows;
  std::string device;  // the jobs' (as the first says; each job runs with the same --device)
  for (const auto& job : jobs) {
    const auto dir = (fs::path(out_dir) / job.label()).string();
    const auto summary = dir + ".json";
    const auto log = dir + ".log";
    fs::remove(summary);
    std::string cmd = quote(program);
    for (const auto& a : args) cmd += " " + quote(a);
    cmd += " --nproc " + std::to_string(job.ranks) + " --parallel " + quote(job.parallel);
    if (job.tp > 0) cmd += " --tp " + std::to_string(job.tp);
    cmd += " --out " + quote(dir) + " --summary " + quote(summary) + " --no-plot --no-progress > " +
           quote(log) + " 2>&1";
    const auto t0 = std::chrono::steady_clock::now();
    const int status = std::system(cmd.c_str());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (status != 0 || !fs::exists(summary)) {
      std::printf("%-12s %d rank(s): FAILED (exit status %d); the end of %s:\n%s",
                  job.parallel.c_str(), job.ranks, status, log.c_str(), tail(log, 8).c_str());
      return 1;
    }
    std::printf("%-12s %d rank(s): done in %.0f s\n", job.parallel.c_str(), job.ranks, seconds);
    std::fflush(stdout);
    std::ifstream in(summary);
    const auto j = json::parse(in);
    if (device.empty()) device = j.value("device", std::string());
    for (const auto& run : j.at("runs")) rows.push_back({job, run});
  }

  // One process is the reference of each run.
  std::map<std::string, double> reference;
  for (const auto& r : rows) {
    if (r.job.parallel == "single") reference[r.run.at("name")] = r.run.at("valid_loss").get<double>();
  }
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "\n%-8s %-11s %5s %10s %11s %13s %13s %14s %9s\n", "run",
                "layout", "ranks", "val loss", "rel. diff", "opt state", "params", "sent/step",
                "ms/step");
  out << line;
  for (const auto& r : rows) {
    const auto name = r.run.at("name").get<std::string>();
    const double loss = r.run.at("valid_loss").get<double>();
    const double ref = reference.count(name) ? reference.at(name) : NAN;
    char diff[32];
    if (r.job.parallel == "single") {
      std::snprintf(diff, sizeof diff, "-");
    } else {
      std::snprintf(diff, sizeof diff, "%.1e", std::abs(loss - ref) / std::abs(ref));
    }
    std::snprintf(line, sizeof line, "%-8s %-11s %5d %10.6f %11s %13s %13s %14s %9.1f\n",
                  name.c_str(), r.job.parallel.c_str(), r.job.ranks, loss, diff,
                  format_bytes(r.run.at("optimizer_state_bytes").get<int64_t>()).c_str(),
                  format_bytes(r.run.at("parameter_bytes").get<int64_t>()).c_str(),
                  format_bytes(r.run.at("bytes_sent_per_step").get<int64_t>()).c_str(),
                  r.run.at("ms_per_step").get<double>());
    out << line;
  }
  out << "(opt state, params: the most loaded rank's; sent/step: bytes a rank sends per training "
         "step, ring model)\n";
  if (!device.empty()) out << "device: " << device << "\n";
  std::printf("%s", out.str().c_str());
  std::ofstream table((fs::path(out_dir) / "layouts.txt").string());
  table << out.str();
  return 0;
}

}  // namespace train_gpt
