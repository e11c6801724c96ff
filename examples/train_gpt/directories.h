#pragma once

/// The directories of muon-train-gpt's --out, --save and --resume, checked
/// on every rank before any run starts (each rank raises the same error, so
/// none waits for another), and --resume auto's choice of checkpoint.
#include <string>
#include <vector>

#include "muon/distributed/runtime/group.h"

namespace train_gpt {

/// The directory `path` of `flag`, created if missing; a path that cannot be
/// a directory (under a regular file, a file itself) raises c10::ValueError
/// naming the flag before anything is written.
void make_directory(const char* flag, const std::string& path);

/// --save `save`: it and the directory of every run's checkpoints in it
/// (`save`/<run>), created if missing and checked writable; otherwise
/// c10::ValueError naming --save and the path. Nothing for "".
void check_save_directories(const std::string& save, const std::vector<std::string>& runs);

/// --resume `resume`: every run has a complete checkpoint in `resume`/<run>
/// (its model shape is checked by the trainer, against the data's
/// vocabulary); "auto" needs --save `save`. Otherwise c10::ValueError naming
/// the flag. Nothing for "".
void check_resume_directories(const std::string& resume, const std::string& save,
                              const std::vector<std::string>& runs);

/// --resume auto for one run: the step directory of the newest checkpoint
/// in `dir` that verifies (every byte read against its checksums), "" (start
/// at step 0) when `dir` holds no complete checkpoint. A newer one that does
/// not verify (a kill or a disk that damaged it) is skipped, saying which and
/// why, so that an elastic job's restart goes on from the one before; when
/// complete checkpoints exist and none verifies, every rank refuses, naming
/// the newest and why, rather than start the run over. Every rank looks, and
/// the ranks agree on the checkpoint they found: a rank that sees another
/// (a directory not shared by every node) raises c10::ValueError on every
/// rank. The reasons are the library's messages, bounded in length.
std::string auto_resume_directory(const muon::distributed::Group& group, const std::string& dir,
                                  const std::string& run);

}  // namespace train_gpt
