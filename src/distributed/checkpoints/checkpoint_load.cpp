// Loading a checkpoint: reading and verifying chunks (each data file's
// header once), filling each rank's block of a tensor from the chunks that
// overlap it, the checks of the model and optimizer against the manifest,
// and the commit once every rank has read all.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "distributed/checkpoints/checkpoint_internal.h"
#include "muon/compat.h"

namespace muon::distributed {
namespace detail {
namespace {

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

// A parameter's optimizer state as read (null: it has none), installed once
// every rank has read all.
struct StagedState {
  StateSlot slot;
  std::unique_ptr<torch::optim::OptimizerParamState> state;  // null: none
};

// This rank's block of each parameter, in order; `index` gets each
// parameter's position. Raises for a parameter the checkpoint or the model
// lacks, or one of another shape or dtype.
std::vector<at::Tensor> read_parameters(ChunkReader& reader, const Manifest& m,
                                        const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                                        const std::vector<Place>& places, std::map<std::string, size_t>& index,
                                        const std::string& where) {
  std::vector<at::Tensor> values;
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
  return values;
}

// The state of `slot` (the parameter `name`, at `param_place`) as the
// checkpoint holds it: its fields read (padding rows of a padded shard
// zeros), then completed for the slot's options.
std::unique_ptr<torch::optim::OptimizerParamState> read_state(ChunkReader& reader, const Manifest& m,
                                                              const StateSlot& slot, const std::string& name,
                                                              const Place& param_place, const std::string& where) {
  auto state = empty_state(slot);
  for (const auto& field : state_fields(slot, *state)) {
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
    // A whole-matrix field is read by the rank that holds it (its owner here).
    if (!field.held) continue;
    const auto box = field.split != StateSplit::kWithRows ? std::optional<Place>(whole_place(l.shape))
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
  complete_state(slot, *state);
  return state;
}

// The state of every parameter the optimizer steps, as the checkpoint holds
// it (none where it holds none). Raises for a state of another kind.
std::vector<StagedState> read_states(ChunkReader& reader, const Manifest& m,
                                     const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                                     torch::optim::Optimizer& optimizer, const std::vector<Place>& places,
                                     const std::map<std::string, size_t>& index, const std::string& where) {
  std::vector<StagedState> states;
  const auto names = names_by_tensor(named_parameters);
  for (const auto& slot : state_slots(optimizer)) {
    const auto& name = name_of_slot(names, slot, kLoadWho);
    const auto kind = m.state.find(name);
    if (kind == m.state.end()) {
      states.push_back({slot, nullptr});
      continue;
    }
    TORCH_CHECK_VALUE(kind->second == slot.kind, kLoadWho, "parameter '", shown(name), "' has ",
                      shown(kind->second), " state in the checkpoint, but this optimizer steps it with ",
                      slot.kind, where);
    states.push_back({slot, read_state(reader, m, slot, name, places[index.at(name)], where)});
  }
  return states;
}

// Installs what every rank has read: nothing here can fail on a checked
// input.
void commit(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
            const std::vector<at::Tensor>& values, std::vector<StagedState>& states) {
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
      install_state(s.slot, std::move(s.state));
    } else {
      s.slot.optimizer->state().erase(compat::state_key(s.slot.param));
    }
  }
}

}  // namespace

void verify_chunks(const Manifest& m) {
  ChunkReader reader(m);
  for (const auto& [key, l] : m.tensors) {
    for (const auto& c : l.chunks) reader.read(key, l, c);
  }
}

}  // namespace detail

CheckpointInfo load_checkpoint(const std::string& path,
                               const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                               torch::optim::Optimizer& optimizer, const DistributedLayout& layout,
                               const CheckpointOptions& options) {
  using detail::kLoadWho;
  using detail::shown;
  const auto [group, group_error] = detail::checkpoint_group(layout, options, kLoadWho);
  const auto placement = detail::place_parameters(named_parameters, layout, kLoadWho);
  // Staged: nothing is changed until every rank has read and verified all.
  std::vector<at::Tensor> values;
  std::vector<detail::StagedState> states;
  detail::Manifest m;
  const auto all = detail::agreed(group, kLoadWho, [&]() {
    TORCH_CHECK_VALUE(group_error.empty(), group_error);
    TORCH_CHECK_VALUE(placement.error.empty(), placement.error);
    m = detail::parse_manifest(detail::resolve(path));
    const auto where = " (checkpoint " + shown(m.dir.string()) + ")";
    detail::ChunkReader reader(m);
    std::map<std::string, size_t> index;
    values = detail::read_parameters(reader, m, named_parameters, placement.places, index, where);
    states = detail::read_states(reader, m, named_parameters, optimizer, placement.places, index, where);
    return std::to_string(m.step) + " " + m.nonce;
  });
  for (const auto& a : all) {
    TORCH_CHECK_VALUE(a == all[0], kLoadWho, "the ranks found different checkpoints in '", shown(path),
                      "' (", all[0], " and ", a, "); give every rank the same directory");
  }
  // Commit: nothing below can fail on a checked input.
  detail::commit(named_parameters, values, states);
  return detail::info_of(m);
}

}  // namespace muon::distributed
