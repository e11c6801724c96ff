// The directories of --out, --save and --resume, and --resume auto.
#include "directories.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <filesystem>

#include "muon/distributed/checkpoints/checkpoint.h"
#include "muon/distributed/runtime/agreement.h"
#include "text.h"

namespace train_gpt {
namespace {

namespace fs = std::filesystem;

// The checkpoint directory `path` of `flag`, created if missing and checked
// writable (muon::distributed::check_checkpoint_dir): otherwise c10::ValueError
// naming the flag and the path, before any step.
void check_save_directory(const char* flag, const std::string& path) {
  try {
    muon::distributed::check_checkpoint_dir(path);
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    const std::string who = "[muon::distributed::check_checkpoint_dir] ";
    if (why.rfind(who, 0) == 0) why.erase(0, who.size());
    TORCH_CHECK_VALUE(false, "[muon-train-gpt] ", flag, " '", clip(path), "': ", why);
  }
}

}  // namespace

// The directory `path` of `flag`, created if missing; a path that cannot be
// a directory (under a regular file, a file itself) raises c10::ValueError
// naming the flag before anything is written.
void make_directory(const char* flag, const std::string& path) {
  std::error_code error;
  fs::create_directories(path, error);
  TORCH_CHECK_VALUE(!error && fs::is_directory(path), "[muon-train-gpt] ", flag, " '", clip(path),
                    "': cannot create this directory: ",
                    error ? error.message() : "a file of that name exists");
}

// Every run has a complete checkpoint under --resume (its model shape is
// checked by the trainer, against the data's vocabulary); --resume auto
// needs --save.
void check_resume_directories(const std::string& resume, const std::string& save,
                              const std::vector<std::string>& runs) {
  if (resume.empty()) return;
  if (resume == "auto") {
    TORCH_CHECK_VALUE(!save.empty(),
                      "[muon-train-gpt] --resume auto continues from the checkpoints of --save; give --save DIR");
    return;
  }
  for (const auto& run : runs) {
    const auto dir = (fs::path(resume) / run).string();
    TORCH_CHECK_VALUE(muon::distributed::latest_checkpoint(dir).has_value(), "[muon-train-gpt] --resume '",
                      clip(resume), "': no complete checkpoint of run '", run, "' in '",
                      clip(dir), "'");
  }
}

// The directories of every run's checkpoints under --save, checked.
void check_save_directories(const std::string& save, const std::vector<std::string>& runs) {
  if (save.empty()) return;
  check_save_directory("--save", save);
  for (const auto& run : runs) check_save_directory("--save", (fs::path(save) / run).string());
}

// --resume auto for one run: the step directory of the newest checkpoint
// in `dir` that verifies (every byte read against its checksums), "" (start
// at step 0) when `dir` holds no complete checkpoint. A newer one that does
// not verify (a kill or a disk that damaged it) is skipped, saying which and
// why, so that an elastic job's restart goes on from the one before; when
// complete checkpoints exist and none verifies, every rank refuses, naming
// the newest and why, rather than start the run over. Every rank looks, and
// the ranks agree on the checkpoint they found: a rank that sees another
// (a directory not shared by every node) raises c10::ValueError on every
// rank. The reasons are the library's messages, bounded in length.
std::string auto_resume_directory(const muon::distributed::Group& group, const std::string& dir,
                                  const std::string& run) {
  std::vector<muon::distributed::SkippedCheckpoint> skipped;
  const auto latest = muon::distributed::latest_verified_checkpoint(dir, &skipped);
  const int64_t step = latest ? latest->step : -1;
  std::string found = latest ? "step " + std::to_string(step) : "none";
  if (!skipped.empty()) found += " (" + std::to_string(skipped.size()) + " newer damaged)";
  muon::distributed::check_ranks_agree(
      group, {{"the newest checkpoint of run '" + run + "' in '" + clip(dir) + "' that verifies", found}},
      "[muon-train-gpt] --resume auto: ", "--save must be one directory every rank sees");
  TORCH_CHECK_VALUE(latest || skipped.empty(), "[muon-train-gpt] --resume auto: run '", run,
                    "': no checkpoint in '", clip(dir), "' verifies (the newest, ", clip(skipped.front().path),
                    ": ", skipped.front().reason, "); move the damaged ones away to start over");
  if (group.rank() == 0) {
    for (const auto& s : skipped) {
      std::printf("run '%s': --resume auto: skipping the damaged checkpoint %s: %s\n", run.c_str(),
                  clip(s.path).c_str(), s.reason.c_str());
    }
    if (latest) {
      std::printf("run '%s': --resume auto: continuing from step %lld (%s)\n", run.c_str(),
                  static_cast<long long>(step), latest->path.c_str());
    } else {
      std::printf("run '%s': --resume auto: no checkpoint in %s yet, starting at step 0\n",
                  run.c_str(), clip(dir).c_str());
    }
    std::fflush(stdout);
  }
  return latest ? latest->path : "";
}

}  // namespace train_gpt
