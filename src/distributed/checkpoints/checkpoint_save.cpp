// Saving a checkpoint: what each rank holds (its parameters' stored parts
// and every field of their optimizer state), the ranks' descriptions of it,
// each rank's data file of the chunks it writes, and rank 0's commit of the
// manifest (then the clean-up of older checkpoints).
#include <algorithm>
#include <cstring>

#include "distributed/checkpoints/checkpoint_internal.h"

namespace muon::distributed {
namespace detail {
namespace {

struct Piece {
  std::string key;  // "model/<name>" or "optim/<name>/<field>"
  at::Tensor data;  // contiguous, on the CPU
  Place place;
  std::string dtype;
  std::string hash;  // XXH3-64 of its bytes, hex
};

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

// What this rank holds: the stored part of each parameter, then every field
// of the state of each parameter the optimizer steps (made as a first step
// makes it where there is none yet). `kinds` gets the kind of each
// parameter that has state.
std::vector<Piece> rank_pieces(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                               torch::optim::Optimizer& optimizer, const std::vector<Place>& places,
                               std::map<std::string, std::string>& kinds) {
  std::vector<Piece> pieces;
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
  for (const auto& slot : state_slots(optimizer)) {
    const auto& name = name_of_slot(names, slot, kSaveWho);
    ensure_state(slot);
    auto* state = find_state(slot);
    if (state == nullptr) continue;
    kinds[name] = slot.kind;
    const auto& param_place = places[index.at(name)];
    for (const auto& field : state_fields(slot, *state)) {
      const auto key = "optim/" + name + "/" + field.name;
      if (field.integer != nullptr) {
        const auto data = at::full({}, *field.integer, at::kLong);
        pieces.push_back({key, data, Place{{}, {}, {}, {}}, "int64", hash_of(data)});
        continue;
      }
      if (!field.tensor->defined()) continue;
      // A whole-matrix field: whole, written by the rank that holds it.
      if (!field.held) continue;
      const auto place = field.split != StateSplit::kWithRows
                             ? std::optional<Place>(whole_place(field.tensor->sizes().vec()))
                             : place_state(param_place, field.tensor->sizes().vec(), false);
      TORCH_CHECK_VALUE(place.has_value(), kSaveWho, "state '", field.name, "' of parameter '",
                        shown(name), "' has shape ", field.tensor->sizes(),
                        ", which does not fit the parameter's ", shape_text(param_place.local));
      const auto data = stored_part(*field.tensor, *place);
      pieces.push_back({key, data, *place, dtype_name(data.scalar_type()), hash_of(data)});
    }
  }
  return pieces;
}

// This rank's description of what it holds, for every rank: its pieces
// (without their data), the kinds of its state, the directory and step
// (which every rank must share), and the save's nonce from rank 0.
std::string describe(const std::vector<Piece>& pieces, const std::map<std::string, std::string>& kinds,
                     const std::string& dir, int64_t step, bool first_rank) {
  json meta{{"pieces", json::array()}, {"state", kinds}, {"dir", dir}, {"step", step}};
  for (const auto& p : pieces) {
    meta["pieces"].push_back({{"key", p.key},
                              {"dtype", p.dtype},
                              {"global", p.place.global},
                              {"offsets", p.place.offsets},
                              {"sizes", p.place.sizes},
                              {"hash", p.hash}});
  }
  if (first_rank) meta["nonce"] = random_hex();
  return meta.dump();
}

// The ranks' descriptions, parsed, once they are known to save the same
// step to the same directory.
std::vector<json> parse_descriptions(const std::vector<std::string>& metas_text) {
  std::vector<json> metas;
  for (const auto& m : metas_text) metas.push_back(json::parse(m));
  for (size_t r = 1; r < metas.size(); ++r) {
    TORCH_CHECK_VALUE(metas[r].at("dir") == metas[0].at("dir") && metas[r].at("step") == metas[0].at("step"),
                      kSaveWho, "rank ", r, " saves step ", metas[r].at("step").dump(), " to '",
                      shown(metas[r].at("dir").get<std::string>()), "', rank 0 step ",
                      metas[0].at("step").dump(), " to '", shown(metas[0].at("dir").get<std::string>()),
                      "': every rank must pass the same directory (on a file system they share) and step");
  }
  return metas;
}

// This rank's data file (none when it writes no chunk): its name, its
// length and the chunks in it.
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

// The manifest of a save: the state kinds and tensors every rank described
// (`metas`), and the data files the ranks wrote (`written`) with their
// chunks. `files` gets the names of those files.
json build_manifest(const std::vector<json>& metas, const std::vector<std::string>& written,
                    const std::string& nonce, int64_t step, int world_size, const std::string& extra,
                    std::set<std::string>& files) {
  json manifest{{"format", kFormat},   {"version", kVersion}, {"step", step},
                {"nonce", nonce},      {"world_size", world_size},
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
  return manifest;
}

}  // namespace
}  // namespace detail

std::string save_checkpoint(const std::string& dir,
                            const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                            torch::optim::Optimizer& optimizer, int64_t step,
                            const DistributedLayout& layout, const std::string& extra,
                            const CheckpointOptions& options) {
  namespace fs = std::filesystem;
  using detail::kSaveWho;
  const auto [group, group_error] = detail::checkpoint_group(layout, options, kSaveWho);
  // Placement first: its collectives run on every rank whatever else fails.
  const auto placement = detail::place_parameters(named_parameters, layout, kSaveWho);
  const auto step_dir = fs::path(dir) / detail::step_dir_name(std::max<int64_t>(step, 0));
  std::vector<detail::Piece> pieces;
  // Phase 1: what this rank holds, described to every rank.
  const auto metas_text = detail::agreed(group, kSaveWho, [&]() {
    TORCH_CHECK_VALUE(group_error.empty(), group_error);
    TORCH_CHECK_VALUE(placement.error.empty(), placement.error);
    TORCH_CHECK_VALUE(step >= 0, kSaveWho, "step must be >= 0, got ", step);
    TORCH_CHECK_VALUE(options.keep() >= 1, kSaveWho, "keep must be >= 1, got ", options.keep());
    TORCH_CHECK_VALUE(!dir.empty(), kSaveWho, "the checkpoint directory is empty");
    std::error_code ec;
    fs::create_directories(step_dir, ec);
    TORCH_CHECK_VALUE(!ec && fs::is_directory(step_dir), kSaveWho, "cannot create '",
                      detail::shown(step_dir.string()), "': ", ec ? ec.message() : "a file of that name exists");
    std::map<std::string, std::string> kinds;
    pieces = detail::rank_pieces(named_parameters, optimizer, placement.places, kinds);
    return detail::describe(pieces, kinds, dir, step, group.rank() == 0);
  });
  const auto metas = detail::parse_descriptions(metas_text);
  const auto nonce = metas[0].at("nonce").get<std::string>();
  // Every rank plans the same (or raises the same error).
  const auto plan = detail::plan_writers(metas);

  // Phase 2: each rank writes the chunks it is the writer of.
  const auto written = detail::agreed(group, kSaveWho, [&]() {
    std::vector<bool> mine;
    for (const auto& p : pieces) {
      const auto writer = plan.writers.at(p.key).at({p.place.offsets, p.place.sizes});
      mine.push_back(writer == group.rank() && p.data.numel() > 0);
    }
    const auto w = detail::write_rank_file(step_dir, group.rank(), step, nonce, pieces, mine, options.fsync());
    return detail::json{{"file", w.file}, {"bytes", w.bytes}, {"chunks", w.chunks}}.dump();
  });

  // Phase 3: rank 0 commits the manifest, then cleans up.
  detail::agreed(group, kSaveWho, [&]() -> std::string {
    if (group.rank() != 0) return "";
    std::set<std::string> files;
    const auto manifest = detail::build_manifest(metas, written, nonce, step, group.size(), extra, files);
    if (options.fsync()) detail::fsync_path(step_dir, kSaveWho);
    detail::write_file_atomically(step_dir / detail::kManifest, detail::sealed(manifest), options.fsync(),
                                  kSaveWho);
    if (options.fsync()) {
      detail::fsync_path(step_dir, kSaveWho);
      detail::fsync_path(dir, kSaveWho);
    }
    detail::clean_up(dir, step_dir, files, options.keep());
    return "";
  });
  return step_dir.string();
}

}  // namespace muon::distributed
