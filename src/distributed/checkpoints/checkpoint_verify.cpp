// Verifying checkpoints without loading them: every byte read and checked
// against the manifest's checksums, and the newest checkpoint of a
// directory that verifies, for a restart that must not stop at a damaged
// one.
#include "distributed/checkpoints/checkpoint_internal.h"

namespace muon::distributed {

CheckpointInfo verify_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  TORCH_CHECK_VALUE(!path.empty(), detail::kLoadWho, "the checkpoint path is empty");
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(path, ec), detail::kLoadWho, "'", detail::shown(path),
                    "' is not a directory");
  const auto found = detail::newest_checkpoint(path);
  TORCH_CHECK_VALUE(found.has_value(), detail::kLoadWho, "'", detail::shown(path),
                    "' holds no complete checkpoint");
  const auto m = detail::parse_manifest(*found);
  detail::verify_chunks(m);
  return detail::info_of(m);
}

std::optional<CheckpointInfo> latest_verified_checkpoint(const std::string& dir,
                                                         std::vector<SkippedCheckpoint>* skipped) {
  const auto dirs = detail::step_dirs(dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (!detail::has_manifest(it->second)) continue;  // an unfinished save: not a checkpoint yet
    try {
      return verify_checkpoint(it->second.string());
    } catch (const c10::Error& e) {
      if (skipped != nullptr) skipped->push_back({it->second.string(), e.what_without_backtrace()});
    }
  }
  return std::nullopt;
}

}  // namespace muon::distributed
