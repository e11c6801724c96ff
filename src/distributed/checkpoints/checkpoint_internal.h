// What the checkpoint files (src/distributed/checkpoints/checkpoint_*.cpp) share: the
// format's constants, the places of each rank's tensors, the pieces a rank
// holds, the parsed manifest, atomic file writes and the collective
// agreement every phase of a save or load ends with. Internal.
#pragma once

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "distributed/checkpoints/checkpoint_state.h"
#include "muon/distributed/checkpoints/checkpoint.h"
#include "util/names.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little-endian: a save writes tensors' bytes as they are in memory");

namespace muon::distributed::detail {

namespace fs = std::filesystem;
using json = nlohmann::json;
using muon::detail::clip;
using Shape = std::vector<int64_t>;

inline constexpr const char* kSaveWho = "[muon::distributed::save_checkpoint] ";
inline constexpr const char* kLoadWho = "[muon::distributed::load_checkpoint] ";
inline constexpr const char* kFormat = "muon-checkpoint";
inline constexpr int64_t kVersion = 1;
inline constexpr int64_t kHeaderBytes = 64;
inline constexpr int64_t kAlign = 64;
inline constexpr char kMagic[8] = {'M', 'U', 'O', 'N', 'C', 'K', 'P', 'T'};
inline constexpr const char* kManifest = "manifest.json";
// Names and paths echoed in messages: at most this many bytes each.
inline constexpr size_t kShown = 160;

// ---- small helpers (dtype names and checksums: checkpoint_manifest.cpp) -------------

inline std::string shown(const std::string& text) { return clip(text, kShown); }

inline std::string shape_text(const Shape& s) { return muon::detail::shape_text(s); }

inline int64_t volume(const Shape& s) {
  int64_t v = 1;
  for (const auto d : s) v *= d;
  return v;
}

// The manifest's name of a dtype (raises for one a checkpoint cannot
// store), and the dtype of a name (nullopt for an unknown one).
std::string dtype_name(at::ScalarType t);
std::optional<at::ScalarType> dtype_of(const std::string& name);

// `v` as 16 hex digits.
std::string hex64(uint64_t v);

// XXH3-64 of `bytes` bytes at `data` (chunk and manifest checksums).
uint64_t hash_bytes(const void* data, size_t bytes);

// ---- files and directories (checkpoint_files.cpp) -----------------------------------

std::string step_dir_name(int64_t step);
std::string rank_file_name(int64_t rank, const std::string& nonce);
std::string errno_text();

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void fsync_path(const fs::path& path, const char* who);

void write_all(int fd, const void* data, int64_t bytes, const fs::path& path, const char* who = kSaveWho);

// Writes `path` through `path`.tmp: `fill(fd, tmp)` writes the contents,
// then the file is fsynced (when `sync`) and renamed into place.
template <typename Fill>
void write_atomically(const fs::path& path, bool sync, const char* who, Fill&& fill) {
  const auto tmp = fs::path(path.string() + ".tmp");
  {
    Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    TORCH_CHECK_VALUE(f.fd >= 0, who, "cannot create '", shown(tmp.string()), "': ", errno_text());
    fill(f.fd, tmp);
    TORCH_CHECK_VALUE(!sync || ::fsync(f.fd) == 0, who, "cannot fsync '", shown(tmp.string()),
                      "': ", errno_text());
  }
  TORCH_CHECK_VALUE(::rename(tmp.c_str(), path.c_str()) == 0, who, "cannot rename '",
                    shown(tmp.string()), "': ", errno_text());
}

// Writes `text` to `path` atomically (write_atomically).
void write_file_atomically(const fs::path& path, const std::string& text, bool sync, const char* who);

// 64 random bits as 16 hex digits (save nonces, probe names).
std::string random_hex();

bool has_manifest(const fs::path& dir);

// Step directories of `dir` with their steps, complete or not.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& dir);

// `path` itself when it is a checkpoint, else its newest complete step
// directory, or nullopt.
std::optional<fs::path> newest_checkpoint(const fs::path& path);

// After a commit: the files the manifest does not name, older checkpoints
// beyond `keep`, unfinished saves older than this one.
void clean_up(const fs::path& dir, const fs::path& step_dir, const std::set<std::string>& keep_files,
              int64_t keep);

// ---- the ranks agree (checkpoint_plan.cpp) ------------------------------------------

// Every rank's `text`, in rank order.
std::vector<std::string> gather_strings(const Group& group, const std::string& text);

// Runs `body`, then the ranks exchange what happened: every rank raises the
// first failure (in rank order), with its rank, or every rank returns what
// every rank's body returned.
template <typename Body>
std::vector<std::string> agreed(const Group& group, const char* who, Body&& body) {
  std::string payload;
  try {
    payload = "+" + body();
  } catch (const c10::Error& e) {
    payload = std::string("-") + e.what_without_backtrace();
  } catch (const std::exception& e) {
    payload = std::string("-") + who + e.what();
  }
  auto all = gather_strings(group, payload);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] == '+') continue;
    auto message = all[r].substr(1);
    if (all.size() > 1) message = "(rank " + std::to_string(r) + ") " + message;
    TORCH_CHECK_VALUE(false, message);
  }
  for (auto& s : all) s.erase(0, 1);
  return all;
}

// ---- where each rank's tensors sit (checkpoint_plan.cpp) ----------------------------

// Where this rank's tensor sits in its global tensor: `local` is the
// tensor's shape; the stored part is its first `sizes` (only dim 0 may be
// shorter: the padding rows of a padded row shard are not stored), at
// `offsets` in `global`.
struct Place {
  Shape global;
  Shape offsets;
  Shape sizes;
  Shape local;
};

// Each parameter's Place, or the first error (the same collectives run on
// every rank either way, so the caller raises it once the ranks agree).
struct Placement {
  std::vector<Place> places;
  std::string error;
};

// Where each parameter (this rank's tensor of it) sits in the global
// parameter. Collective over the parameters' shard groups.
Placement place_parameters(const torch::OrderedDict<std::string, at::Tensor>& named,
                           const DistributedLayout& layout, const char* who);

// A tensor every rank holds whole (a replicated state field).
inline Place whole_place(const Shape& shape) { return Place{shape, Shape(shape.size(), 0), shape, shape}; }

// Where a state tensor sits for a parameter at `param`, from its `local`
// shape (saving) or its `global` shape (loading).
std::optional<Place> place_state(const Place& param, const Shape& shape, bool shape_is_global);

// Parameter names by tensor, to name what an optimizer steps.
std::unordered_map<const void*, std::string> names_by_tensor(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters);

const std::string& name_of_slot(const std::unordered_map<const void*, std::string>& names,
                                const StateSlot& slot, const char* who);

// The group a checkpoint is collective over, and an error (raised once the
// ranks agree) when a shard group reaches outside it.
std::pair<Group, std::string> checkpoint_group(const DistributedLayout& layout, const CheckpointOptions& options,
                                               const char* who);

// ---- who writes what (checkpoint_plan.cpp) ------------------------------------------

// Which rank writes each distinct chunk of each key, after checking that the
// ranks describe the same logical tensors and that the chunks tile them.
struct Plan {
  // key → (offsets, sizes) → writer rank
  std::map<std::string, std::map<std::pair<Shape, Shape>, int64_t>> writers;
};

// From every rank's description of the pieces it holds
// (checkpoint_save.cpp): {"pieces": [{key, dtype, global, offsets, sizes,
// hash}], ...}.
Plan plan_writers(const std::vector<json>& metas);

// ---- the manifest (checkpoint_manifest.cpp) -----------------------------------------

struct Chunk {
  Shape offsets;
  Shape sizes;
  int64_t file = -1;
  int64_t offset = 0;
  int64_t bytes = 0;
  std::string hash;
};

struct Logical {
  std::string dtype;
  Shape shape;
  std::vector<Chunk> chunks;
};

struct FileEntry {
  std::string name;
  int64_t rank = 0;
  int64_t bytes = 0;
};

struct Manifest {
  fs::path dir;
  int64_t step = 0;
  std::string nonce;
  int64_t world_size = 0;
  std::string extra;
  std::vector<FileEntry> files;
  std::map<std::string, std::string> state;  // parameter → kind
  std::map<std::string, Logical> tensors;
};

// Parses and checks a manifest; every error names `path` and the entry.
Manifest parse_manifest(const fs::path& dir);

// The manifest's text: its JSON with a last line `"xxh3": "<hex>"}` whose
// checksum covers every byte before that line.
std::string sealed(const json& manifest);

CheckpointInfo info_of(const Manifest& m);

// Reads every chunk of `m` once and checks its file's header and size and
// the chunk's checksum, as a load does (checkpoint_load.cpp).
void verify_chunks(const Manifest& m);

}  // namespace muon::distributed::detail
