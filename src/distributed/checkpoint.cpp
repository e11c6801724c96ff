// Checkpoints: a JSON manifest plus raw chunk bytes per rank, committed by
// an atomic rename of the manifest, verified chunk by chunk, reshardable.
#include "muon/distributed/checkpoint.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "distributed/checkpoint_state.h"
#include "muon/compat.h"
#include "util/names.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint files are little-endian: this file writes tensors' bytes as they are in memory");

namespace muon::dist {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using muon::detail::clip;
using Shape = std::vector<int64_t>;

constexpr const char* kSaveWho = "[muon::dist::save_checkpoint] ";
constexpr const char* kLoadWho = "[muon::dist::load_checkpoint] ";
constexpr const char* kFormat = "muon-checkpoint";
constexpr int64_t kVersion = 1;
constexpr int64_t kHeaderBytes = 64;
constexpr int64_t kAlign = 64;
constexpr char kMagic[8] = {'M', 'U', 'O', 'N', 'C', 'K', 'P', 'T'};
constexpr const char* kManifest = "manifest.json";
// Names and paths echoed in messages: at most this many bytes each.
constexpr size_t kShown = 160;

// ---- small helpers --------------------------------------------------------------

std::string shown(const std::string& text) { return clip(text, kShown); }

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t volume(const Shape& s) {
  int64_t v = 1;
  for (const auto d : s) v *= d;
  return v;
}

const std::vector<std::pair<const char*, at::ScalarType>>& dtype_names() {
  static const std::vector<std::pair<const char*, at::ScalarType>> names{
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"bfloat16", at::kBFloat16},
      {"float16", at::kHalf},  {"int64", at::kLong},     {"int32", at::kInt},
      {"int16", at::kShort},   {"int8", at::kChar},      {"uint8", at::kByte},
      {"bool", at::kBool}};
  return names;
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& [name, type] : dtype_names()) {
    if (type == t) return name;
  }
  TORCH_CHECK_VALUE(false, kSaveWho, "tensors of dtype ", t, " cannot be stored");
  return "";
}

std::optional<at::ScalarType> dtype_of(const std::string& name) {
  for (const auto& [n, type] : dtype_names()) {
    if (name == n) return type;
  }
  return std::nullopt;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

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

void fsync_path(const fs::path& path, const char* who) {
  Fd f(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  TORCH_CHECK_VALUE(f.fd >= 0 && ::fsync(f.fd) == 0, who, "cannot fsync directory '",
                    shown(path.string()), "': ", errno_text());
}

void write_all(int fd, const void* data, int64_t bytes, const fs::path& path, const char* who = kSaveWho) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const auto n = ::write(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)));
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK_VALUE(n > 0, who, "cannot write '", shown(path.string()), "': ", errno_text());
    p += n;
    bytes -= n;
  }
}

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

// ---- the ranks agree ------------------------------------------------------------

// Every rank's `text`, in rank order: lengths first, then the bytes packed
// eight to an int64 (all_gather_ints moves them on the group's device, so
// NCCL groups work too).
std::vector<std::string> gather_strings(const Group& group, const std::string& text) {
  const auto lengths = group.all_gather_ints({static_cast<int64_t>(text.size())});
  size_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, static_cast<size_t>(l[0]));
  std::vector<int64_t> packed(std::max<size_t>(1, (longest + 7) / 8), 0);
  std::memcpy(packed.data(), text.data(), text.size());
  const auto all = group.all_gather_ints(packed);
  std::vector<std::string> out;
  for (size_t r = 0; r < all.size(); ++r) {
    out.emplace_back(reinterpret_cast<const char*>(all[r].data()), static_cast<size_t>(lengths[r][0]));
  }
  return out;
}

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

// ---- where each rank's tensors sit ------------------------------------------------

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
// parameter. Collective over the parameters' shard groups: one all-gather of
// block sizes per group (in the order the groups first appear, the same on
// every rank). Row shards may be padded (flat-buffer style: the rows past
// the global shape are padding) or empty.
Placement place_parameters(const torch::OrderedDict<std::string, at::Tensor>& named,
                           const DistributedLayout& layout, const char* who) {
  struct Request {
    size_t param;
    size_t dim;
    int64_t local;
    bool rows;  // a row shard's rows (may hold padding)
  };
  Placement out;
  auto fail = [&](const std::string& message) {
    if (out.error.empty()) out.error = message;
  };
  auto& places = out.places;
  std::vector<std::pair<Group, std::vector<Request>>> groups;
  auto request = [&](const Group& g, size_t param, size_t dim, int64_t local, bool rows) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& e) {
      return e.first.name() == g.name() && e.first.world_ranks() == g.world_ranks();
    });
    if (it == groups.end()) it = groups.insert(groups.end(), {g, {}});
    it->second.push_back({param, dim, local, rows});
  };
  std::vector<Shape> tp_global(named.size());
  std::vector<int64_t> row_offset(named.size(), 0);
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& name = named[i].key();
    const auto& local = named[i].value();
    const auto shape = local.sizes().vec();
    places.push_back({shape, Shape(shape.size(), 0), shape, shape});
    auto& p = places.back();
    const auto row = layout.row_shards.find(name);
    const auto tp = layout.tensor_parallel.find(name);
    if (row != layout.row_shards.end()) {
      const auto& shard = row->second;
      if (shape.empty() || shape.size() != shard.global_shape().size()) {
        fail(c10::str(who, "parameter '", shown(name), "' has shape ", local.sizes(),
                      ", its row shard a global shape ", shape_text(shard.global_shape())));
      } else {
        p.global = shard.global_shape();
      }
      request(shard.group(), i, 0, shape.empty() ? 0 : shape[0], true);
      if (shard.has_tensor_parallel()) {
        const auto& t = shard.tp();
        const auto d = static_cast<size_t>(t.partition_dim());
        const bool fits = t.global_shape().size() == p.global.size() && d < p.global.size();
        if (!fits) {
          fail(c10::str(who, "parameter '", shown(name), "': its tensor-parallel global shape ",
                        shape_text(t.global_shape()), " does not fit its block ", shape_text(p.global)));
        }
        request(t.group(), i, fits ? d : 0, fits ? p.global[d] : 0, false);
        if (fits) tp_global[i] = t.global_shape();
      }
    } else if (tp != layout.tensor_parallel.end()) {
      const auto& t = tp->second;
      const auto d = static_cast<size_t>(t.partition_dim());
      const bool fits = t.global_shape().size() == shape.size() && d < shape.size();
      if (!fits) {
        fail(c10::str(who, "parameter '", shown(name), "' has shape ", local.sizes(),
                      ", its tensor-parallel shard a global shape ", shape_text(t.global_shape())));
      }
      request(t.group(), i, fits ? d : 0, fits ? shape[d] : 0, false);
      if (fits) p.global = t.global_shape();
    }
  }
  for (const auto& [group, requests] : groups) {
    std::vector<int64_t> sizes;
    for (const auto& r : requests) sizes.push_back(r.local);
    std::vector<std::vector<int64_t>> all;
    try {
      all = group.all_gather_ints(sizes);
    } catch (const c10::Error& e) {
      // Ranks that hold other numbers of this group's shards.
      fail(c10::str(who, "the ranks of group '", group.name(), "' describe different shards: ",
                    e.what_without_backtrace()));
      continue;
    }
    for (size_t j = 0; j < requests.size(); ++j) {
      int64_t offset = 0;
      for (int r = 0; r < group.rank(); ++r) offset += all[static_cast<size_t>(r)][j];
      if (requests[j].rows) {
        row_offset[requests[j].param] = offset;
      } else {
        places[requests[j].param].offsets[requests[j].dim] += offset;
      }
    }
  }
  for (size_t i = 0; i < named.size(); ++i) {
    auto& p = places[i];
    if (layout.row_shards.count(named[i].key()) != 0 && !p.sizes.empty()) {
      // Rows past the block's end are padding: not stored.
      const auto block_rows = p.global[0];
      const auto start = std::min(row_offset[i], block_rows);
      p.sizes[0] = std::max<int64_t>(0, std::min(p.local[0], block_rows - start));
      p.offsets[0] += start;
    }
    if (!tp_global[i].empty()) p.global = tp_global[i];
    for (size_t d = 0; d < p.global.size() && out.error.empty(); ++d) {
      if (p.offsets[d] + p.sizes[d] > p.global[d]) {
        fail(c10::str(who, "parameter '", shown(named[i].key()), "': the blocks of the ranks exceed its global shape ",
                      shape_text(p.global), " in dim ", d));
      }
    }
  }
  return out;
}

// The matrix view of a place: dim 0 × the rest (only where the rest is whole).
std::optional<Place> matrix_view(const Place& p) {
  if (p.global.size() < 2) return std::nullopt;
  Place m{{p.global[0], 1}, {p.offsets[0], 0}, {p.sizes[0], 1}, {p.local[0], 1}};
  for (size_t d = 1; d < p.global.size(); ++d) {
    if (p.offsets[d] != 0 || p.sizes[d] != p.global[d] || p.local[d] != p.global[d]) return std::nullopt;
    m.global[1] *= p.global[d];
    m.sizes[1] *= p.sizes[d];
    m.local[1] *= p.local[d];
  }
  return m;
}

// Where a state tensor sits for a parameter at `param`, from its `local`
// shape (saving) or its `global` shape (loading): a dimension of the
// parameter's size is split like the parameter, one of size 1 is
// replicated. Shapes of another rank are compared against the parameter's
// matrix view (dim 0 × the rest).
// A tensor every rank holds whole (a replicated state field).
Place whole_place(const Shape& shape) { return Place{shape, Shape(shape.size(), 0), shape, shape}; }

std::optional<Place> place_state(const Place& param, const Shape& shape, bool shape_is_global) {
  auto fit = [&](const Place& p) -> std::optional<Place> {
    if (p.global.size() != shape.size()) return std::nullopt;
    Place out{shape, Shape(shape.size(), 0), shape, shape};
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == (shape_is_global ? p.global[d] : p.local[d])) {
        out.global[d] = p.global[d];
        out.offsets[d] = p.offsets[d];
        out.sizes[d] = p.sizes[d];
        out.local[d] = p.local[d];
      } else if (shape[d] != 1) {
        return std::nullopt;
      }
    }
    return out;
  };
  if (auto direct = fit(param)) return direct;
  if (const auto m = matrix_view(param)) return fit(*m);
  return std::nullopt;
}

// ---- what a rank holds -----------------------------------------------------------

struct Piece {
  std::string key;  // "model/<name>" or "optim/<name>/<field>"
  at::Tensor data;  // contiguous, on the CPU
  Place place;
  std::string dtype;
  std::string hash;  // XXH3-64 of its bytes, hex
};

uint64_t hash_bytes(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::string hash_of(const at::Tensor& t) {
  return hex64(hash_bytes(t.data_ptr(), t.numel() * t.element_size()));
}

// The stored part of `t` at `place`: its first rows (a padded shard's
// padding rows are not stored), on the CPU, contiguous.
at::Tensor stored_part(const at::Tensor& t, const Place& place) {
  const auto data = t.detach().to(at::kCPU).contiguous();
  if (data.dim() == 0 || place.sizes[0] == data.size(0)) return data;
  return data.narrow(0, 0, place.sizes[0]).contiguous();
}

// Parameter names by tensor, to name what an optimizer steps.
std::unordered_map<const void*, std::string> names_by_tensor(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters) {
  std::unordered_map<const void*, std::string> out;
  for (const auto& item : named_parameters) out[item.value().unsafeGetTensorImpl()] = item.key();
  return out;
}

const std::string& name_of_slot(const std::unordered_map<const void*, std::string>& names,
                                const detail::StateSlot& slot, const char* who) {
  const auto it = names.find(slot.param.unsafeGetTensorImpl());
  TORCH_CHECK_VALUE(it != names.end(), who, "the optimizer steps a tensor of shape ", slot.param.sizes(),
                    " (", slot.kind, ") that is not among the named parameters given");
  return it->second;
}

// The group a checkpoint is collective over, and an error (raised once the
// ranks agree) when a shard group reaches outside it.
std::pair<Group, std::string> checkpoint_group(const DistributedLayout& layout, const CheckpointOptions& options,
                                               const char* who) {
  Group g = options.group().valid() ? options.group() : layout.group.valid() ? layout.group : Group::single();
  // Every rank a parameter is split over must take part (one manifest, one
  // writer per chunk): its shard groups lie inside the checkpoint's group.
  const auto& members = g.world_ranks();
  std::string error;
  auto check = [&](const Group& shard_group, const std::string& name) {
    for (const int r : shard_group.world_ranks()) {
      if (error.empty() && std::find(members.begin(), members.end(), r) == members.end()) {
        error = c10::str(who, "parameter '", shown(name), "' is split over group '", shard_group.name(),
                         "', whose rank ", r, " is not in the checkpoint's group '", g.name(),
                         "'; pass the world as CheckpointOptions::group");
      }
    }
  };
  for (const auto& [name, shard] : layout.row_shards) {
    check(shard.group(), name);
    if (shard.has_tensor_parallel()) check(shard.tp().group(), name);
  }
  for (const auto& [name, shard] : layout.tensor_parallel) check(shard.group(), name);
  return {g, error};
}

// ---- the manifest ----------------------------------------------------------------

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

Shape ints_of(const json& j, const std::string& what) {
  TORCH_CHECK_VALUE(j.is_array(), what, " is not a list");
  Shape out;
  for (const auto& v : j) {
    TORCH_CHECK_VALUE(v.is_number_integer() && v.get<int64_t>() >= 0, what, " holds ", shown(v.dump()),
                      ", not a count");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// The elements of `shape`, or -1 past int64.
int64_t checked_volume(const Shape& shape) {
  int64_t v = 1;
  for (const auto d : shape) {
    if (__builtin_mul_overflow(v, d, &v)) return -1;
  }
  return v;
}

// The chunks of `l` must tile its shape: each inside it (checked as they
// are read), no two overlapping, their elements adding up to the shape's.
// Counting alone would let overlapping chunks whose counts add up leave
// part of the tensor unread. Chunks sorted by their first offset; each is
// compared with the earlier ones whose first-dimension range it reaches
// (one for row slabs, a grid's column for blocks).
void check_tiling(const std::string& what, const Logical& l) {
  const auto total = checked_volume(l.shape);
  TORCH_CHECK_VALUE(total >= 0, what, " has a shape of more than 2^63 elements");
  if (l.shape.empty()) {
    TORCH_CHECK_VALUE(l.chunks.size() == 1, what, " is a scalar stored in ", l.chunks.size(),
                      " chunks, not one");
    return;
  }
  std::vector<size_t> order(l.chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return l.chunks[a].offsets[0] < l.chunks[b].offsets[0];
  });
  std::vector<size_t> open;  // chunks that may still reach the next ones
  int64_t covered = 0;
  for (const auto i : order) {
    const auto& c = l.chunks[i];
    const auto n = volume(c.sizes);
    covered += n;
    if (n == 0) continue;
    open.erase(std::remove_if(open.begin(), open.end(),
                              [&](size_t j) {
                                const auto& o = l.chunks[j];
                                return o.offsets[0] + o.sizes[0] <= c.offsets[0];
                              }),
               open.end());
    for (const auto j : open) {
      const auto& o = l.chunks[j];
      bool overlap = true;
      for (size_t d = 0; d < l.shape.size() && overlap; ++d) {
        overlap = std::max(o.offsets[d], c.offsets[d]) <
                  std::min(o.offsets[d] + o.sizes[d], c.offsets[d] + c.sizes[d]);
      }
      TORCH_CHECK_VALUE(!overlap, what, " has overlapping chunks at ", shape_text(o.offsets), " of ",
                        shape_text(o.sizes), " and at ", shape_text(c.offsets), " of ",
                        shape_text(c.sizes), " (damaged or forged manifest)");
    }
    open.push_back(i);
  }
  TORCH_CHECK_VALUE(covered == total, what, ": its chunks hold ", covered, " of its ", total,
                    " elements (damaged or forged manifest)");
}

// Parses and checks a manifest; every error names `path` and the entry.
Manifest parse_manifest(const fs::path& dir) {
  const auto path = dir / kManifest;
  const auto where = std::string(kLoadWho) + "manifest " + shown(path.string());
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), where, " cannot be read: ", errno_text());
  std::stringstream text;
  text << in.rdbuf();
  const auto raw = text.str();
  // The last line holds the checksum of every byte before it; checked
  // before the text is parsed.
  auto end = raw.size();
  while (end > 0 && raw[end - 1] == '\n') --end;
  const auto last = end == 0 ? std::string::npos : raw.rfind('\n', end - 1);
  const std::string seal = last == std::string::npos ? "" : raw.substr(last + 1, end - last - 1);
  const std::string prefix = "\"xxh3\": \"";
  TORCH_CHECK_VALUE(seal.size() == prefix.size() + 18 && seal.rfind(prefix, 0) == 0 &&
                        seal.substr(prefix.size() + 16) == "\"}" &&
                        seal.substr(prefix.size(), 16) == hex64(hash_bytes(raw.data(), last)),
                    where, " does not match its checksum (the manifest is damaged)");
  json j;
  try {
    j = json::parse(raw);
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, where, " is not valid JSON: ", shown(e.what()));
  }
  Manifest m;
  m.dir = dir;
  try {
    TORCH_CHECK_VALUE(j.is_object() && j.value("format", "") == kFormat, where, " is not a ", kFormat,
                      " manifest");
    TORCH_CHECK_VALUE(j.at("version").get<int64_t>() == kVersion, where, " has format version ",
                      shown(j.at("version").dump()), "; this library reads version ", kVersion);
    m.step = j.at("step").get<int64_t>();
    m.nonce = j.at("nonce").get<std::string>();
    m.world_size = j.at("world_size").get<int64_t>();
    m.extra = j.at("extra").get<std::string>();
    for (const auto& f : j.at("files")) {
      FileEntry e{f.at("name").get<std::string>(), f.at("rank").get<int64_t>(), f.at("bytes").get<int64_t>()};
      TORCH_CHECK_VALUE(!e.name.empty() && e.name.find('/') == std::string::npos && e.name[0] != '.' &&
                            e.bytes >= kHeaderBytes,
                        where, " names a bad data file '", shown(e.name), "'");
      m.files.push_back(std::move(e));
    }
    for (const auto& [name, kind] : j.at("state").items()) m.state[name] = kind.get<std::string>();
    for (const auto& [key, t] : j.at("tensors").items()) {
      const auto what = where + " tensor '" + shown(key) + "'";
      Logical l;
      l.dtype = t.at("dtype").get<std::string>();
      TORCH_CHECK_VALUE(dtype_of(l.dtype).has_value(), what, " has an unknown dtype '", shown(l.dtype), "'");
      l.shape = ints_of(t.at("shape"), what + " shape");
      const auto element = static_cast<int64_t>(c10::elementSize(*dtype_of(l.dtype)));
      for (const auto& c : t.at("chunks")) {
        Chunk k;
        k.offsets = ints_of(c.at("offsets"), what + " chunk offsets");
        k.sizes = ints_of(c.at("sizes"), what + " chunk sizes");
        k.file = c.at("file").get<int64_t>();
        k.offset = c.at("offset").get<int64_t>();
        k.bytes = c.at("bytes").get<int64_t>();
        k.hash = c.at("xxh3").get<std::string>();
        TORCH_CHECK_VALUE(k.offsets.size() == l.shape.size() && k.sizes.size() == l.shape.size(), what,
                          " has a chunk of another rank than its shape");
        for (size_t d = 0; d < l.shape.size(); ++d) {
          // (No sum that could pass int64: every value is >= 0.)
          TORCH_CHECK_VALUE(k.sizes[d] <= l.shape[d] && k.offsets[d] <= l.shape[d] - k.sizes[d], what,
                            " has a chunk at ", shape_text(k.offsets), " of ", shape_text(k.sizes),
                            " outside its shape ", shape_text(l.shape));
        }
        TORCH_CHECK_VALUE(checked_volume(l.shape) >= 0, what, " has a shape of more than 2^63 elements");
        TORCH_CHECK_VALUE(k.file >= 0 && k.file < static_cast<int64_t>(m.files.size()) &&
                              volume(k.sizes) <= std::numeric_limits<int64_t>::max() / element &&
                              k.bytes == volume(k.sizes) * element && k.offset >= kHeaderBytes &&
                              k.bytes <= m.files[static_cast<size_t>(k.file)].bytes &&
                              k.offset <= m.files[static_cast<size_t>(k.file)].bytes - k.bytes,
                          what, " has a chunk whose file, offset or length is inconsistent");
        l.chunks.push_back(std::move(k));
      }
      check_tiling(what, l);
      m.tensors[key] = std::move(l);
    }
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, where, " is missing an entry or has one of the wrong type: ", shown(e.what()));
  }
  return m;
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

// The manifest's text: its JSON with a last line `"xxh3": "<hex>"}` whose
// checksum covers every byte before that line.
std::string sealed(const json& manifest) {
  auto body = manifest.dump(1);
  body.pop_back();  // the closing brace
  while (!body.empty() && body.back() == '\n') body.pop_back();
  body += ",";
  return body + "\n\"xxh3\": \"" + hex64(hash_bytes(body.data(), body.size())) + "\"}\n";
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

CheckpointInfo info_of(const Manifest& m) {
  CheckpointInfo info{m.step, m.dir.string(), m.world_size, m.extra, 0};
  for (const auto& f : m.files) info.bytes += f.bytes;
  return info;
}

// ---- saving ----------------------------------------------------------------------

// Which rank writes each distinct chunk of each key, after checking that the
// ranks describe the same logical tensors and that the chunks tile them.
struct Plan {
  // key → (offsets, sizes) → writer rank
  std::map<std::string, std::map<std::pair<Shape, Shape>, int64_t>> writers;
};

Plan plan_writers(const std::vector<json>& metas) {
  Plan plan;
  std::map<std::string, std::pair<std::string, Shape>> first;  // key → dtype, global shape
  std::map<std::string, std::map<std::pair<Shape, Shape>, std::pair<int64_t, std::string>>> seen;
  for (size_t r = 0; r < metas.size(); ++r) {
    for (const auto& p : metas[r].at("pieces")) {
      const auto key = p.at("key").get<std::string>();
      const auto dtype = p.at("dtype").get<std::string>();
      const auto global = p.at("global").get<Shape>();
      const auto box = std::make_pair(p.at("offsets").get<Shape>(), p.at("sizes").get<Shape>());
      const auto hash = p.at("hash").get<std::string>();
      const auto [it, fresh] = first.emplace(key, std::make_pair(dtype, global));
      TORCH_CHECK_VALUE(fresh || it->second == std::make_pair(dtype, global), kSaveWho, "'", shown(key),
                        "' is ", it->second.first, " ", shape_text(it->second.second), " on one rank, ",
                        dtype, " ", shape_text(global), " on rank ", r,
                        " (a sharded parameter without its shard in the layout?)");
      auto& boxes = seen[key];
      const auto [b, added] = boxes.emplace(box, std::make_pair(static_cast<int64_t>(r), hash));
      TORCH_CHECK_VALUE(added || b->second.second == hash, kSaveWho, "'", shown(key),
                        "' differs between rank ", b->second.first, " and rank ", r,
                        " at the same place ", shape_text(box.first),
                        ": the ranks diverged, or the tensor is a shard missing from the layout");
    }
  }
  for (const auto& [key, boxes] : seen) {
    const auto& global = first[key].second;
    int64_t covered = 0;
    std::vector<std::pair<Shape, Shape>> list;
    for (const auto& [box, writer] : boxes) {
      covered += volume(box.second);
      list.push_back(box);
      plan.writers[key][box] = writer.first;
    }
    // Distinct chunks must not overlap, and together cover the tensor.
    for (size_t a = 0; a < list.size(); ++a) {
      for (size_t b = a + 1; b < list.size(); ++b) {
        bool overlap = volume(list[a].second) > 0 && volume(list[b].second) > 0;
        for (size_t d = 0; overlap && d < global.size(); ++d) {
          overlap = list[a].first[d] < list[b].first[d] + list[b].second[d] &&
                    list[b].first[d] < list[a].first[d] + list[a].second[d];
        }
        TORCH_CHECK_VALUE(!overlap, kSaveWho, "'", shown(key), "': the ranks' blocks at ",
                          shape_text(list[a].first), " and ", shape_text(list[b].first),
                          " overlap; check the layout's shards");
      }
    }
    TORCH_CHECK_VALUE(covered == volume(global), kSaveWho, "'", shown(key), "': the ranks' blocks cover ",
                      covered, " of its ", volume(global), " elements; check the layout's shards");
  }
  return plan;
}

struct Written {
  json chunks = json::array();  // {key, offsets, sizes, offset, bytes, xxh3}
  int64_t bytes = 0;
  std::string file;
};

Written write_rank_file(const fs::path& step_dir, int64_t rank, int64_t step, const std::string& nonce,
                        const std::vector<Piece>& pieces, const std::vector<bool>& mine, bool sync) {
  Written w;
  if (std::none_of(mine.begin(), mine.end(), [](bool b) { return b; })) return w;
  w.file = rank_file_name(rank, nonce);
  write_atomically(step_dir / w.file, sync, kSaveWho, [&](int fd, const fs::path& tmp) {
    char header[kHeaderBytes] = {};
    std::memcpy(header, kMagic, sizeof(kMagic));
    const uint32_t version = kVersion;
    const auto rank32 = static_cast<uint32_t>(rank);
    const uint64_t nonce64 = std::stoull(nonce, nullptr, 16);
    std::memcpy(header + 8, &version, 4);
    std::memcpy(header + 12, &rank32, 4);
    std::memcpy(header + 16, &step, 8);
    std::memcpy(header + 24, &nonce64, 8);
    write_all(fd, header, kHeaderBytes, tmp);
    int64_t at = kHeaderBytes;
    static const char zeros[kAlign] = {};
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!mine[i]) continue;
      const auto& p = pieces[i];
      const auto bytes = static_cast<int64_t>(p.data.numel() * p.data.element_size());
      const auto pad = (kAlign - at % kAlign) % kAlign;
      write_all(fd, zeros, pad, tmp);
      at += pad;
      write_all(fd, p.data.data_ptr(), bytes, tmp);
      w.chunks.push_back({{"key", p.key},
                          {"offsets", p.place.offsets},
                          {"sizes", p.place.sizes},
                          {"offset", at},
                          {"bytes", bytes},
                          {"xxh3", p.hash}});
      at += bytes;
    }
    w.bytes = at;
  });
  return w;
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

}  // namespace

void check_checkpoint_dir(const std::string& dir) {
  constexpr const char* who = "[muon::dist::check_checkpoint_dir] ";
  TORCH_CHECK_VALUE(!dir.empty(), who, "the checkpoint directory is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK_VALUE(!ec && fs::is_directory(dir), who, "cannot create the checkpoint directory '",
                    shown(dir), "': ", ec ? ec.message() : "a file of that name exists");
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  const auto probe = fs::path(dir) / (".muon-write-check-" + std::string(host) + "-" + std::to_string(::getpid()) +
                                      "-" + random_hex());
  try {
    write_file_atomically(probe, "muon", true, who);
    fsync_path(dir, who);
  } catch (...) {
    fs::remove(probe.string() + ".tmp", ec);
    fs::remove(probe, ec);
    // The message names the file and the system's reason.
    throw;
  }
  fs::remove(probe, ec);
}

std::string save_checkpoint(const std::string& dir,
                            const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                            torch::optim::Optimizer& optimizer, int64_t step,
                            const DistributedLayout& layout, const std::string& extra,
                            const CheckpointOptions& options) {
  const auto [group, group_error] = checkpoint_group(layout, options, kSaveWho);
  // Placement first: its collectives run on every rank whatever else fails.
  const auto placement = place_parameters(named_parameters, layout, kSaveWho);
  const auto& places = placement.places;
  const auto step_dir = fs::path(dir) / step_dir_name(std::max<int64_t>(step, 0));
  std::vector<Piece> pieces;
  std::map<std::string, std::string> kinds;
  // Phase 1: what this rank holds, described to every rank.
  const auto metas_text = agreed(group, kSaveWho, [&]() {
    TORCH_CHECK_VALUE(group_error.empty(), group_error);
    TORCH_CHECK_VALUE(placement.error.empty(), placement.error);
    TORCH_CHECK_VALUE(step >= 0, kSaveWho, "step must be >= 0, got ", step);
    TORCH_CHECK_VALUE(options.keep() >= 1, kSaveWho, "keep must be >= 1, got ", options.keep());
    TORCH_CHECK_VALUE(!dir.empty(), kSaveWho, "the checkpoint directory is empty");
    std::error_code ec;
    fs::create_directories(step_dir, ec);
    TORCH_CHECK_VALUE(!ec && fs::is_directory(step_dir), kSaveWho, "cannot create '",
                      shown(step_dir.string()), "': ", ec ? ec.message() : "a file of that name exists");
    std::map<std::string, size_t> index;
    size_t i = 0;
    for (const auto& item : named_parameters) {
      index[item.key()] = i;
      const auto data = stored_part(item.value(), places[i]);
      pieces.push_back({"model/" + item.key(), data, places[i],
                        dtype_name(data.scalar_type()), hash_of(data)});
      ++i;
    }
    const auto names = names_by_tensor(named_parameters);
    for (const auto& slot : detail::state_slots(optimizer)) {
      const auto& name = name_of_slot(names, slot, kSaveWho);
      detail::ensure_state(slot);
      auto* state = detail::find_state(slot);
      if (state == nullptr) continue;
      kinds[name] = slot.kind;
      const auto& param_place = places[index.at(name)];
      for (const auto& field : detail::state_fields(slot, *state)) {
        const auto key = "optim/" + name + "/" + field.name;
        if (field.integer != nullptr) {
          const auto data = at::full({}, *field.integer, at::kLong);
          pieces.push_back({key, data, Place{{}, {}, {}, {}}, "int64", hash_of(data)});
          continue;
        }
        if (!field.tensor->defined()) continue;
        const auto place = field.split == StateSplit::kReplicated
                               ? std::optional<Place>(whole_place(field.tensor->sizes().vec()))
                               : place_state(param_place, field.tensor->sizes().vec(), false);
        TORCH_CHECK_VALUE(place.has_value(), kSaveWho, "state '", field.name, "' of parameter '",
                          shown(name), "' has shape ", field.tensor->sizes(),
                          ", which does not fit the parameter's ", shape_text(param_place.local));
        const auto data = stored_part(*field.tensor, *place);
        pieces.push_back({key, data, *place, dtype_name(data.scalar_type()), hash_of(data)});
      }
    }
    json meta{{"pieces", json::array()}, {"state", kinds}, {"dir", dir}, {"step", step}};
    for (const auto& p : pieces) {
      meta["pieces"].push_back({{"key", p.key},
                                {"dtype", p.dtype},
                                {"global", p.place.global},
                                {"offsets", p.place.offsets},
                                {"sizes", p.place.sizes},
                                {"hash", p.hash}});
    }
    if (group.rank() == 0) meta["nonce"] = random_hex();
    return meta.dump();
  });
  std::vector<json> metas;
  for (const auto& m : metas_text) metas.push_back(json::parse(m));
  for (size_t r = 1; r < metas.size(); ++r) {
    TORCH_CHECK_VALUE(metas[r].at("dir") == metas[0].at("dir") && metas[r].at("step") == metas[0].at("step"),
                      kSaveWho, "rank ", r, " saves step ", metas[r].at("step").dump(), " to '",
                      shown(metas[r].at("dir").get<std::string>()), "', rank 0 step ",
                      metas[0].at("step").dump(), " to '", shown(metas[0].at("dir").get<std::string>()),
                      "': every rank must pass the same directory (on a file system they share) and step");
  }
  const auto nonce = metas[0].at("nonce").get<std::string>();
  // Every rank plans the same (or raises the same error).
  const auto plan = plan_writers(metas);

  // Phase 2: each rank writes the chunks it is the writer of.
  const auto written = agreed(group, kSaveWho, [&]() {
    std::vector<bool> mine;
    for (const auto& p : pieces) {
      const auto writer = plan.writers.at(p.key).at({p.place.offsets, p.place.sizes});
      mine.push_back(writer == group.rank() && p.data.numel() > 0);
    }
    const auto w = write_rank_file(step_dir, group.rank(), step, nonce, pieces, mine, options.fsync());
    return json{{"file", w.file}, {"bytes", w.bytes}, {"chunks", w.chunks}}.dump();
  });

  // Phase 3: rank 0 commits the manifest, then cleans up.
  agreed(group, kSaveWho, [&]() -> std::string {
    if (group.rank() != 0) return "";
    json manifest{{"format", kFormat},   {"version", kVersion}, {"step", step},
                  {"nonce", nonce},      {"world_size", group.size()},
                  {"extra", extra},      {"files", json::array()},
                  {"state", json::object()}, {"tensors", json::object()}};
    for (const auto& m : metas) {
      for (const auto& [name, kind] : m.at("state").items()) manifest["state"][name] = kind;
      for (const auto& p : m.at("pieces")) {
        auto& t = manifest["tensors"][p.at("key").get<std::string>()];
        t["dtype"] = p.at("dtype");
        t["shape"] = p.at("global");
        if (!t.contains("chunks")) t["chunks"] = json::array();
      }
    }
    std::set<std::string> files;
    for (size_t r = 0; r < written.size(); ++r) {
      const auto w = json::parse(written[r]);
      const auto file = w.at("file").get<std::string>();
      if (file.empty()) continue;
      files.insert(file);
      const auto index = manifest["files"].size();
      manifest["files"].push_back({{"name", file}, {"rank", r}, {"bytes", w.at("bytes")}});
      for (const auto& c : w.at("chunks")) {
        manifest["tensors"][c.at("key").get<std::string>()]["chunks"].push_back(
            {{"offsets", c.at("offsets")}, {"sizes", c.at("sizes")}, {"file", index},
             {"offset", c.at("offset")}, {"bytes", c.at("bytes")}, {"xxh3", c.at("xxh3")}});
      }
    }
    if (options.fsync()) fsync_path(step_dir, kSaveWho);
    write_file_atomically(step_dir / kManifest, sealed(manifest), options.fsync(), kSaveWho);
    if (options.fsync()) {
      fsync_path(step_dir, kSaveWho);
      fsync_path(dir, kSaveWho);
    }
    clean_up(dir, step_dir, files, options.keep());
    return "";
  });
  return step_dir.string();
}

std::optional<CheckpointInfo> latest_checkpoint(const std::string& dir) {
  const auto path = newest_checkpoint(dir);
  if (!path) return std::nullopt;
  return info_of(parse_manifest(*path));
}

namespace {

// ---- loading ---------------------------------------------------------------------

// Reads and verifies chunks of a manifest's files, each file's header once.
class ChunkReader {
 public:
  explicit ChunkReader(const Manifest& m) : m_(m) {}

  // The bytes of `chunk` of `key`, verified, as a tensor of its sizes.
  at::Tensor read(const std::string& key, const Logical& l, const Chunk& chunk) {
    const auto& f = m_.files[static_cast<size_t>(chunk.file)];
    const auto path = m_.dir / f.name;
    const int fd = open_checked(f, path);
    auto out = at::empty(chunk.sizes, *dtype_of(l.dtype));
    auto* p = static_cast<char*>(out.data_ptr());
    int64_t done = 0;
    while (done < chunk.bytes) {
      const auto n = ::pread(fd, p + done, static_cast<size_t>(chunk.bytes - done), chunk.offset + done);
      if (n < 0 && errno == EINTR) continue;
      TORCH_CHECK_VALUE(n > 0, kLoadWho, "file ", shown(path.string()), " ends inside '", shown(key),
                        "' (truncated?)");
      done += n;
    }
    TORCH_CHECK_VALUE(hex64(hash_bytes(p, static_cast<size_t>(chunk.bytes))) == chunk.hash, kLoadWho,
                      "file ", shown(path.string()), ": the bytes of '", shown(key), "' at ",
                      shape_text(chunk.offsets), " do not match their checksum (the file is damaged)");
    return out;
  }

 private:
  int open_checked(const FileEntry& f, const fs::path& path) {
    const auto it = fds_.find(f.name);
    if (it != fds_.end()) return it->second->fd;
    auto fd = std::make_unique<Fd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    TORCH_CHECK_VALUE(fd->fd >= 0, kLoadWho, "file ", shown(path.string()), " cannot be opened: ",
                      errno_text(), " (the checkpoint is incomplete)");
    struct stat st {};
    TORCH_CHECK_VALUE(::fstat(fd->fd, &st) == 0 && st.st_size == f.bytes, kLoadWho, "file ",
                      shown(path.string()), " has ", static_cast<int64_t>(st.st_size),
                      " bytes, the manifest says ", f.bytes, " (truncated or replaced)");
    char header[kHeaderBytes];
    TORCH_CHECK_VALUE(::pread(fd->fd, header, kHeaderBytes, 0) == kHeaderBytes &&
                          std::memcmp(header, kMagic, sizeof(kMagic)) == 0,
                      kLoadWho, "file ", shown(path.string()), " is not a checkpoint data file");
    uint32_t version = 0;
    std::memcpy(&version, header + 8, 4);
    TORCH_CHECK_VALUE(version == kVersion, kLoadWho, "file ", shown(path.string()), " has format version ",
                      version, "; this library reads version ", kVersion);
    int64_t step = 0;
    uint64_t nonce = 0;
    std::memcpy(&step, header + 16, 8);
    std::memcpy(&nonce, header + 24, 8);
    TORCH_CHECK_VALUE(step == m_.step && hex64(nonce) == m_.nonce, kLoadWho, "file ", shown(path.string()),
                      " was written by the save of step ", step, ", not by this checkpoint's (step ",
                      m_.step, "): files of different saves are mixed");
    const int raw = fd->fd;
    fds_[f.name] = std::move(fd);
    return raw;
  }

  const Manifest& m_;
  std::map<std::string, std::unique_ptr<Fd>> fds_;
};

// Fills this rank's `box` of logical tensor `key` from the chunks overlapping it.
at::Tensor read_box(ChunkReader& reader, const std::string& key, const Logical& l, const Place& box) {
  auto out = at::empty(box.sizes, *dtype_of(l.dtype));
  int64_t filled = 0;
  for (const auto& c : l.chunks) {
    Shape lo(box.sizes.size()), len(box.sizes.size());
    bool overlap = true;
    for (size_t d = 0; d < box.sizes.size() && overlap; ++d) {
      lo[d] = std::max(c.offsets[d], box.offsets[d]);
      const auto hi = std::min(c.offsets[d] + c.sizes[d], box.offsets[d] + box.sizes[d]);
      len[d] = hi - lo[d];
      overlap = len[d] > 0;
    }
    if (!overlap) continue;
    const auto chunk = reader.read(key, l, c);
    auto src = chunk;
    auto dst = out;
    for (size_t d = 0; d < lo.size(); ++d) {
      const auto dd = static_cast<int64_t>(d);
      src = src.narrow(dd, lo[d] - c.offsets[d], len[d]);
      dst = dst.narrow(dd, lo[d] - box.offsets[d], len[d]);
    }
    dst.copy_(src);
    filled += volume(len);
  }
  TORCH_CHECK_VALUE(filled == volume(box.sizes), kLoadWho, "'", shown(key), "': the checkpoint's chunks cover ",
                    filled, " of the ", volume(box.sizes), " elements this rank needs (damaged manifest?)");
  return out;
}

fs::path resolve(const std::string& path) {
  TORCH_CHECK_VALUE(!path.empty(), kLoadWho, "the checkpoint path is empty");
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(path, ec), kLoadWho, "'", shown(path), "' is not a directory");
  const auto found = newest_checkpoint(path);
  TORCH_CHECK_VALUE(found.has_value(), kLoadWho, "'", shown(path), "' holds no complete checkpoint (",
                    step_dirs(path).size(), " step directories, none with a ", kManifest, ")");
  return *found;
}

}  // namespace

CheckpointInfo load_checkpoint(const std::string& path,
                               const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                               torch::optim::Optimizer& optimizer, const DistributedLayout& layout,
                               const CheckpointOptions& options) {
  const auto [group, group_error] = checkpoint_group(layout, options, kLoadWho);
  const auto placement = place_parameters(named_parameters, layout, kLoadWho);
  const auto& places = placement.places;
  // Staged: nothing is changed until every rank has read and verified all.
  std::vector<at::Tensor> values;
  struct StagedState {
    detail::StateSlot slot;
    std::unique_ptr<torch::optim::OptimizerParamState> state;  // null: none
  };
  std::vector<StagedState> states;
  Manifest m;
  const auto all = agreed(group, kLoadWho, [&]() {
    TORCH_CHECK_VALUE(group_error.empty(), group_error);
    TORCH_CHECK_VALUE(placement.error.empty(), placement.error);
    m = parse_manifest(resolve(path));
    const auto where = " (checkpoint " + shown(m.dir.string()) + ")";
    ChunkReader reader(m);
    std::map<std::string, size_t> index;
    size_t i = 0;
    for (const auto& item : named_parameters) {
      const auto& name = item.key();
      index[name] = i;
      const auto& place = places[i++];
      const auto it = m.tensors.find("model/" + name);
      TORCH_CHECK_VALUE(it != m.tensors.end(), kLoadWho, "parameter '", shown(name),
                        "' is not in the checkpoint", where);
      const auto& l = it->second;
      TORCH_CHECK_VALUE(l.shape == place.global, kLoadWho, "parameter '", shown(name), "' has shape ",
                        shape_text(place.global), " in this model, ", shape_text(l.shape),
                        " in the checkpoint", where);
      TORCH_CHECK_VALUE(l.dtype == dtype_name(item.value().scalar_type()), kLoadWho, "parameter '",
                        shown(name), "' is ", dtype_name(item.value().scalar_type()), " in this model, ",
                        l.dtype, " in the checkpoint", where);
      values.push_back(read_box(reader, "model/" + name, l, place));
    }
    for (const auto& [key, l] : m.tensors) {
      if (key.rfind("model/", 0) != 0) continue;
      TORCH_CHECK_VALUE(index.count(key.substr(6)) != 0, kLoadWho, "the checkpoint has parameter '",
                        shown(key.substr(6)), "', which this model does not", where);
    }
    const auto names = names_by_tensor(named_parameters);
    for (const auto& slot : detail::state_slots(optimizer)) {
      const auto& name = name_of_slot(names, slot, kLoadWho);
      const auto kind = m.state.find(name);
      if (kind == m.state.end()) {
        states.push_back({slot, nullptr});
        continue;
      }
      TORCH_CHECK_VALUE(kind->second == slot.kind, kLoadWho, "parameter '", shown(name), "' has ",
                        shown(kind->second), " state in the checkpoint, but this optimizer steps it with ",
                        slot.kind, where);
      auto state = detail::empty_state(slot);
      const auto& param_place = places[index.at(name)];
      for (const auto& field : detail::state_fields(slot, *state)) {
        const auto key = "optim/" + name + "/" + field.name;
        const auto it = m.tensors.find(key);
        if (it == m.tensors.end()) continue;
        const auto& l = it->second;
        if (field.integer != nullptr) {
          TORCH_CHECK_VALUE(l.shape.empty() && l.dtype == "int64", kLoadWho, "'", shown(key),
                            "' is not an integer", where);
          *field.integer = read_box(reader, key, l, Place{{}, {}, {}, {}}).item<int64_t>();
          continue;
        }
        const auto box = field.split == StateSplit::kReplicated ? std::optional<Place>(whole_place(l.shape))
                                                                 : place_state(param_place, l.shape, true);
        TORCH_CHECK_VALUE(box.has_value(), kLoadWho, "'", shown(key), "' has shape ", shape_text(l.shape),
                          ", which does not fit parameter '", shown(name), "' of shape ",
                          shape_text(param_place.global), where);
        auto value = read_box(reader, key, l, *box);
        if (value.dim() > 0 && value.size(0) != box->local[0]) {
          // A padded shard: its padding rows of state are zeros.
          auto whole = at::zeros(box->local, value.options());
          whole.narrow(0, 0, value.size(0)).copy_(value);
          value = whole;
        }
        *field.tensor = value.to(slot.param.device());
      }
      detail::complete_state(slot, *state);
      states.push_back({slot, std::move(state)});
    }
    return std::to_string(m.step) + " " + m.nonce;
  });
  for (const auto& a : all) {
    TORCH_CHECK_VALUE(a == all[0], kLoadWho, "the ranks found different checkpoints in '", shown(path),
                      "' (", all[0], " and ", a, "); give every rank the same directory");
  }
  // Commit: nothing below can fail on a checked input.
  {
    at::NoGradGuard no_grad;
    size_t i = 0;
    for (const auto& item : named_parameters) {
      const auto& v = values[i++];
      auto target = item.value();
      // A padded shard keeps its padding rows.
      if (v.dim() > 0 && v.size(0) != target.size(0)) target = target.narrow(0, 0, v.size(0));
      target.copy_(v);
    }
  }
  for (auto& s : states) {
    if (s.state) {
      detail::install_state(s.slot, std::move(s.state));
    } else {
      s.slot.optimizer->state().erase(compat::state_key(s.slot.param));
    }
  }
  return info_of(m);
}

}  // namespace muon::dist
