// Checkpoint files and directories: names of step directories and data
// files, atomic writes (temporary file, fsync, rename), step directories
// and the newest complete one, the clean-up after a commit, and the
// writability probe check_checkpoint_dir.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "distributed/checkpoints/checkpoint_internal.h"

namespace muon::distributed {
namespace detail {

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08" PRId64, step);
  return buf;
}

std::string rank_file_name(int64_t rank, const std::string& nonce) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05" PRId64 "-", rank);
  return buf + nonce + ".bin";
}

std::string errno_text() { return std::strerror(errno); }

void fsync_path(const fs::path& path, const char* who) {
  Fd f(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  TORCH_CHECK_VALUE(f.fd >= 0 && ::fsync(f.fd) == 0, who, "cannot fsync directory '",
                    shown(path.string()), "': ", errno_text());
}

void write_all(int fd, const void* data, int64_t bytes, const fs::path& path, const char* who) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const auto n = ::write(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)));
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK_VALUE(n > 0, who, "cannot write '", shown(path.string()), "': ", errno_text());
    p += n;
    bytes -= n;
  }
}

// Writes `text` to `path` atomically (write_atomically).
void write_file_atomically(const fs::path& path, const std::string& text, bool sync, const char* who) {
  write_atomically(path, sync, who, [&](int fd, const fs::path& tmp) {
    write_all(fd, text.data(), static_cast<int64_t>(text.size()), tmp, who);
  });
}

// 64 random bits as 16 hex digits (save nonces, probe names).
std::string random_hex() {
  std::random_device device;
  return hex64((static_cast<uint64_t>(device()) << 32) ^ device() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
}

bool has_manifest(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kManifest, ec);
}

// Step directories of `dir` with their steps, complete or not.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.size() < 13 || name.size() > 23 || name.rfind("step-", 0) != 0) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    out.emplace_back(std::stoll(name.substr(5)), it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `path` itself when it is a checkpoint, else its newest complete step
// directory, or nullopt.
std::optional<fs::path> newest_checkpoint(const fs::path& path) {
  if (has_manifest(path)) return path;
  const auto dirs = step_dirs(path);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (has_manifest(it->second)) return it->second;
  }
  return std::nullopt;
}

// After a commit: the files the manifest does not name, older checkpoints
// beyond `keep`, unfinished saves older than this one. A checkpoint is
// removed manifest first, so a kill midway leaves an unfinished save, never
// a manifest without its files.
void clean_up(const fs::path& dir, const fs::path& step_dir, const std::set<std::string>& keep_files,
              int64_t keep) {
  std::error_code ec;
  for (fs::directory_iterator it(step_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name != kManifest && keep_files.count(name) == 0) fs::remove_all(it->path(), ec);
  }
  const auto dirs = step_dirs(dir);
  int64_t complete = 0;  // complete checkpoints at least as new, this one included
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->second == step_dir) {
      ++complete;
      continue;
    }
    const bool done = has_manifest(it->second);
    if (done ? ++complete <= keep : complete == 0) continue;
    if (done) fs::remove(it->second / kManifest, ec);
    fs::remove_all(it->second, ec);
  }
}

}  // namespace detail

void check_checkpoint_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  using detail::shown;
  constexpr const char* who = "[muon::distributed::check_checkpoint_dir] ";
  TORCH_CHECK_VALUE(!dir.empty(), who, "the checkpoint directory is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK_VALUE(!ec && fs::is_directory(dir), who, "cannot create the checkpoint directory '",
                    shown(dir), "': ", ec ? ec.message() : "a file of that name exists");
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  const auto probe = fs::path(dir) / (".muon-write-check-" + std::string(host) + "-" + std::to_string(::getpid()) +
                                      "-" + detail::random_hex());
  try {
    detail::write_file_atomically(probe, "muon", true, who);
    detail::fsync_path(dir, who);
  } catch (...) {
    fs::remove(probe.string() + ".tmp", ec);
    fs::remove(probe, ec);
    // The message names the file and the system's reason.
    throw;
  }
  fs::remove(probe, ec);
}

}  // namespace muon::distributed
