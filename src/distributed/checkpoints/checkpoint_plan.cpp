// Who holds and who writes what in a checkpoint: the ranks' agreement on
// each phase, where each rank's parameters and state tensors sit in their
// global tensors (row shards, padding, tensor-parallel blocks), the
// checkpoint's group, and the plan of which rank writes each chunk.
#include <algorithm>
#include <cstring>

#include "distributed/checkpoints/checkpoint_internal.h"

namespace muon::distributed::detail {

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

namespace {

// Builds a Placement (place_parameters): each parameter's shape and the
// block sizes its shard groups exchange, then the offsets those sizes give.
// Keeps the first error, and runs the same collectives whatever fails.
class Placer {
 public:
  Placer(size_t count, const char* who) : who_(who), tp_global_(count), row_offset_(count, 0) {}

  // Parameter i's place before the exchange: its global shape, and the
  // block sizes to exchange over its row shard's and tensor-parallel groups.
  void describe(size_t i, const std::string& name, const at::Tensor& local, const DistributedLayout& layout) {
    auto& places = out_.places;
    const auto shape = local.sizes().vec();
    places.push_back({shape, Shape(shape.size(), 0), shape, shape});
    auto& p = places.back();
    const auto row = layout.row_shards.find(name);
    const auto tp = layout.tensor_parallel.find(name);
    if (row != layout.row_shards.end()) {
      const auto& shard = row->second;
      if (shape.empty() || shape.size() != shard.global_shape().size()) {
        fail(c10::str(who_, "parameter '", shown(name), "' has shape ", local.sizes(),
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
          fail(c10::str(who_, "parameter '", shown(name), "': its tensor-parallel global shape ",
                        shape_text(t.global_shape()), " does not fit its block ", shape_text(p.global)));
        }
        request(t.group(), i, fits ? d : 0, fits ? p.global[d] : 0, false);
        if (fits) tp_global_[i] = t.global_shape();
      }
    } else if (tp != layout.tensor_parallel.end()) {
      const auto& t = tp->second;
      const auto d = static_cast<size_t>(t.partition_dim());
      const bool fits = t.global_shape().size() == shape.size() && d < shape.size();
      if (!fits) {
        fail(c10::str(who_, "parameter '", shown(name), "' has shape ", local.sizes(),
                      ", its tensor-parallel shard a global shape ", shape_text(t.global_shape())));
      }
      request(t.group(), i, fits ? d : 0, fits ? shape[d] : 0, false);
      if (fits) p.global = t.global_shape();
    }
  }

  // One all-gather of block sizes per group, in the order the groups first
  // appear (the same on every rank): each block's offset is the sizes of
  // the ranks before this one.
  void exchange() {
    for (const auto& [group, requests] : groups_) {
      std::vector<int64_t> sizes;
      for (const auto& r : requests) sizes.push_back(r.local);
      std::vector<std::vector<int64_t>> all;
      try {
        all = group.all_gather_ints(sizes);
      } catch (const c10::Error& e) {
        // Ranks that hold other numbers of this group's shards.
        fail(c10::str(who_, "the ranks of group '", group.name(), "' describe different shards: ",
                      e.what_without_backtrace()));
        continue;
      }
      for (size_t j = 0; j < requests.size(); ++j) {
        int64_t offset = 0;
        for (int r = 0; r < group.rank(); ++r) offset += all[static_cast<size_t>(r)][j];
        if (requests[j].rows) {
          row_offset_[requests[j].param] = offset;
        } else {
          out_.places[requests[j].param].offsets[requests[j].dim] += offset;
        }
      }
    }
  }

  // The places once the offsets are known: a row shard's stored rows (not
  // its padding), the tensor-parallel matrix's global shape, and each
  // block inside its global shape.
  Placement finish(const torch::OrderedDict<std::string, at::Tensor>& named, const DistributedLayout& layout) {
    auto& places = out_.places;
    for (size_t i = 0; i < named.size(); ++i) {
      auto& p = places[i];
      if (layout.row_shards.count(named[i].key()) != 0 && !p.sizes.empty()) {
        // Rows past the block's end are padding: not stored.
        const auto block_rows = p.global[0];
        const auto start = std::min(row_offset_[i], block_rows);
        p.sizes[0] = std::max<int64_t>(0, std::min(p.local[0], block_rows - start));
        p.offsets[0] += start;
      }
      if (!tp_global_[i].empty()) p.global = tp_global_[i];
      for (size_t d = 0; d < p.global.size() && out_.error.empty(); ++d) {
        if (p.offsets[d] + p.sizes[d] > p.global[d]) {
          fail(c10::str(who_, "parameter '", shown(named[i].key()),
                        "': the blocks of the ranks exceed its global shape ", shape_text(p.global), " in dim ",
                        d));
        }
      }
    }
    return std::move(out_);
  }

 private:
  struct Request {
    size_t param;
    size_t dim;
    int64_t local;
    bool rows;  // a row shard's rows (may hold padding)
  };

  void fail(const std::string& message) {
    if (out_.error.empty()) out_.error = message;
  }

  void request(const Group& g, size_t param, size_t dim, int64_t local, bool rows) {
    auto it = std::find_if(groups_.begin(), groups_.end(), [&](const auto& e) {
      return e.first.name() == g.name() && e.first.world_ranks() == g.world_ranks();
    });
    if (it == groups_.end()) it = groups_.insert(groups_.end(), {g, {}});
    it->second.push_back({param, dim, local, rows});
  }

  const char* who_;
  Placement out_;
  std::vector<std::pair<Group, std::vector<Request>>> groups_;
  std::vector<Shape> tp_global_;
  std::vector<int64_t> row_offset_;
};

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

}  // namespace

// Where each parameter (this rank's tensor of it) sits in the global
// parameter. Collective over the parameters' shard groups: one all-gather of
// block sizes per group (in the order the groups first appear, the same on
// every rank). Row shards may be padded (flat-buffer style: the rows past
// the global shape are padding) or empty.
Placement place_parameters(const torch::OrderedDict<std::string, at::Tensor>& named,
                           const DistributedLayout& layout, const char* who) {
  Placer placer(named.size(), who);
  for (size_t i = 0; i < named.size(); ++i) placer.describe(i, named[i].key(), named[i].value(), layout);
  placer.exchange();
  return placer.finish(named, layout);
}

// Where a state tensor sits for a parameter at `param`, from its `local`
// shape (saving) or its `global` shape (loading): a dimension of the
// parameter's size is split like the parameter, one of size 1 is
// replicated. Shapes of another rank are compared against the parameter's
// matrix view (dim 0 × the rest).
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

// Parameter names by tensor, to name what an optimizer steps.
std::unordered_map<const void*, std::string> names_by_tensor(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters) {
  std::unordered_map<const void*, std::string> out;
  for (const auto& item : named_parameters) out[item.value().unsafeGetTensorImpl()] = item.key();
  return out;
}

const std::string& name_of_slot(const std::unordered_map<const void*, std::string>& names,
                                const StateSlot& slot, const char* who) {
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

}  // namespace muon::distributed::detail
