// Checkpoint manifests: dtype names, checksums (XXH3-64), the sealed
// manifest text, and parsing a manifest with every check a load relies on
// (entries, chunk bounds, chunks tiling their tensor); latest_checkpoint.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "distributed/checkpoints/checkpoint_internal.h"

namespace muon::distributed {
namespace detail {
namespace {

const std::vector<std::pair<const char*, at::ScalarType>>& dtype_names() {
  static const std::vector<std::pair<const char*, at::ScalarType>> names{
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"bfloat16", at::kBFloat16},
      {"float16", at::kHalf},  {"int64", at::kLong},     {"int32", at::kInt},
      {"int16", at::kShort},   {"int8", at::kChar},      {"uint8", at::kByte},
      {"bool", at::kBool}};
  return names;
}

}  // namespace

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

uint64_t hash_bytes(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

namespace {

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

}  // namespace

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

std::string sealed(const json& manifest) {
  auto body = manifest.dump(1);
  body.pop_back();  // the closing brace
  while (!body.empty() && body.back() == '\n') body.pop_back();
  body += ",";
  return body + "\n\"xxh3\": \"" + hex64(hash_bytes(body.data(), body.size())) + "\"}\n";
}

CheckpointInfo info_of(const Manifest& m) {
  CheckpointInfo info{m.step, m.dir.string(), m.world_size, m.extra, 0};
  for (const auto& f : m.files) info.bytes += f.bytes;
  return info;
}

}  // namespace detail

std::optional<CheckpointInfo> latest_checkpoint(const std::string& dir) {
  const auto path = detail::newest_checkpoint(dir);
  if (!path) return std::nullopt;
  return detail::info_of(detail::parse_manifest(*path));
}

}  // namespace muon::distributed
