// Muon over row-sharded parameters: owner-compute or replicated orthogonalization.
#include "muon/distributed/sharded.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>
#include <numeric>
#include <tuple>
#include <utility>

#include "distributed/agreement.h"
#include "distributed/max_over.h"
#include "distributed/tensor_parallel_block.h"
#include "muon/distributed/assignment.h"
#include "muon/newton_schulz.h"
#include "muon/scaling.h"
#include "util/names.h"

namespace muon::dist {
namespace {

constexpr const char* kWho = "[muon::dist::ShardedMuon] ";

using torch::optim::OptimizerParamGroup;


bool same_group(const Group& a, const Group& b) {
  return a.name() == b.name() && a.world_ranks() == b.world_ranks();
}

// Rows [offset, offset + count) of `matrix` (M × N), zero past row M.
at::Tensor rows_padded(const at::Tensor& matrix, int64_t offset, int64_t count) {
  const int64_t m = matrix.size(0);
  auto out = at::zeros({count, matrix.size(1)}, matrix.options());
  const int64_t begin = std::min(offset, m);
  const int64_t end = std::min(offset + count, m);
  if (end > begin) out.narrow(0, 0, end - begin).copy_(matrix.narrow(0, begin, end - begin));
  return out;
}

constexpr muon::detail::EnumName<ShardedMode> kModes[] = {
    {ShardedMode::kOwnerCompute, "owner_compute"}, {ShardedMode::kReplicated, "replicated"}};

}  // namespace

std::string to_string(ShardedMode mode) { return muon::detail::name_of(mode, kModes); }

namespace {
// What the ranks of one group must agree on besides shapes: the layout's
// options, each member's dtype, and the options of every param group that
// has a member (lr, momentum, Newton–Schulz, ...).
std::vector<AgreementItem> settings_items(const ShardedOptions& options,
                                          const std::vector<size_t>& members,
                                          const std::vector<at::Tensor>& params,
                                          const std::vector<size_t>& param_group_of,
                                          const std::vector<OptimizerParamGroup>& param_groups) {
  std::vector<AgreementItem> items{
      {"mode of the sharded layout", to_string(options.mode())},
      {"max_in_flight of the sharded layout", std::to_string(options.max_in_flight())}};
  std::vector<size_t> described;
  for (const auto i : members) {
    items.push_back({c10::str("dtype of parameter ", i), c10::toString(params[i].scalar_type())});
    const auto g = param_group_of[i];
    if (std::find(described.begin(), described.end(), g) != described.end()) continue;
    described.push_back(g);
    detail::append_option_items(items, param_groups[g].options(), c10::str("param group ", g));
  }
  return items;
}
}  // namespace

ShardedMode parse_sharded_mode(const std::string& name) {
  return muon::detail::parse_name(name, kModes, kWho, "sharded mode");
}

ShardedOptions& ShardedOptions::mode(const std::string& name) {
  mode_ = parse_sharded_mode(name);
  return *this;
}

ShardedOptions& ShardedOptions::shard(const at::Tensor& param, RowShard shard) {
  TORCH_CHECK_VALUE(param.defined(), kWho, "shard: param is undefined");
  shards_.emplace_back(param, std::move(shard));
  return *this;
}

namespace {
ShardedOptions with_shards(ShardedOptions options, const std::vector<at::Tensor>& params,
                           std::vector<RowShard> shards) {
  TORCH_CHECK_VALUE(shards.size() == params.size(), kWho, "got ", shards.size(),
                    " shard descriptions for ", params.size(), " parameters");
  for (const auto i : c10::irange(params.size())) options.shard(params[i], std::move(shards[i]));
  return options;
}
}  // namespace

ShardedMuon::ShardedMuon(std::vector<at::Tensor> params, std::vector<RowShard> shards,
                         MuonOptions defaults, ShardedOptions options)
    : ShardedMuon(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                  with_shards(std::move(options), params, std::move(shards))) {}

ShardedMuon::ShardedMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                         ShardedOptions options)
    : ShardedMuon(std::move(param_groups), std::move(defaults),
                  make_orthogonalizer(std::move(options))) {}

ShardedMuon::ShardedMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                         std::shared_ptr<ShardedOrthogonalizer> strategy)
    : Muon(std::move(param_groups), std::move(defaults), strategy), strategy_(std::move(strategy)) {}

std::string ShardedMuon::archive_kind() const { return "muon::dist::ShardedMuon"; }

// ---- the strategy ------------------------------------------------------------

ShardedOrthogonalizer::ShardedOrthogonalizer(ShardedOptions options)
    : options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.max_in_flight() >= 0, kWho, "max_in_flight must be >= 0, got ",
                    options_.max_in_flight());
}

std::shared_ptr<ShardedOrthogonalizer> make_orthogonalizer(ShardedOptions options) {
  return std::make_shared<ShardedOrthogonalizer>(std::move(options));
}

void ShardedOrthogonalizer::check_options(const MuonOptions& o, size_t group) const {
  TORCH_CHECK_VALUE(o.split_sizes().empty(), kWho, "param group ", group,
                    ": split_sizes (fused QKV) is not supported on row shards");
  // Which parameters are stacked experts is fixed when the layout is built
  // (they have no owner); empty before attach.
  for (const auto i : c10::irange(layout_.size())) {
    const auto& l = layout_[i];
    if (l.param_group != group || l.global_shape.size() < 3) continue;
    TORCH_CHECK_VALUE(o.stacked_experts() == l.experts, kWho, "param group ", group,
                      ": stacked_experts was ", l.experts ? "on" : "off",
                      " when the optimizer was built and is ", o.stacked_experts() ? "on" : "off",
                      " now; the row-shard layout of parameter ", i,
                      " is fixed at construction, so build a new optimizer to change it");
  }
}

void ShardedOrthogonalizer::attach(const std::vector<OptimizerParamGroup>& param_groups) {
  std::unordered_map<const void*, size_t> shard_of;
  for (const auto k : c10::irange(options_.shards().size())) {
    shard_of.emplace(options_.shards()[k].first.unsafeGetTensorImpl(), k);
  }
  std::vector<at::Tensor> group_params;
  std::vector<RowShard> shards;
  std::vector<size_t> param_group_of;
  for (const auto gi : c10::irange(param_groups.size())) {
    for (const auto j : c10::irange(param_groups[gi].params().size())) {
      const auto& p = param_groups[gi].params()[j];
      const auto it = shard_of.find(p.unsafeGetTensorImpl());
      TORCH_CHECK_VALUE(it != shard_of.end(), kWho, "parameter ", j, " of group ", gi, " (shape ",
                        p.sizes(), ") has no RowShard; declare it with ShardedOptions::shard");
      group_params.push_back(p);
      shards.push_back(options_.shards()[it->second].second);
      index_.emplace(p.unsafeGetTensorImpl(), params_.size());
      params_.push_back(p);
      param_group_of.push_back(gi);
    }
  }
  // Per parameter: its place, its group; per group: the exchange below.
  std::vector<std::vector<size_t>> members;
  for (const auto i : c10::irange(group_params.size())) {
    const auto& p = group_params[i];
    const auto& shard = shards[i];
    TORCH_CHECK_VALUE(shard.group().valid(), kWho, "the group of parameter ", i,
                      " is invalid (default-constructed); there is no default group");
    const auto& global = shard.global_shape();
    TORCH_CHECK_VALUE(global.size() >= 2, kWho, "parameter ", i, ": global_shape ",
                      c10::IntArrayRef(global), " must have at least 2 dimensions");
    TORCH_CHECK_VALUE(p.dim() == static_cast<int64_t>(global.size()) &&
                          p.sizes().slice(1) == c10::IntArrayRef(global).slice(1),
                      kWho, "parameter ", i, ": a row shard of global shape ",
                      c10::IntArrayRef(global), " must have shape (rows, ",
                      c10::IntArrayRef(global).slice(1), "), got ", p.sizes());
    Layout l;
    l.param_group = param_group_of[i];
    l.global_shape = global;
    std::tie(l.rows, l.cols) = matrix_dims(c10::IntArrayRef(global));
    l.scale_rows = l.rows;
    l.scale_cols = l.cols;
    const auto* o = dynamic_cast<const MuonOptions*>(&param_groups[l.param_group].options());
    l.experts = o != nullptr && o->stacked_experts() && global.size() >= 3;
    if (l.experts) {
      // Dim 0 holds whole experts: each rank orthogonalizes its own, each
      // scaled from its (out, in...) shape.
      TORCH_CHECK_VALUE(!shard.has_tensor_parallel(), kWho, "parameter ", i, " (global shape ",
                        c10::IntArrayRef(global), "): stacked experts are not supported in a 2-D "
                        "layout (RowShard::tensor_parallel); shard the experts over their expert "
                        "group without a tensor-parallel block, or turn stacked_experts off");
      std::tie(l.scale_rows, l.scale_cols) = matrix_dims(c10::IntArrayRef(global).slice(1));
    }
    if (shard.has_tensor_parallel()) {
      const auto& tp = shard.tp();
      TORCH_CHECK_VALUE(global.size() == 2 && tp.global_shape().size() == 2, kWho, "parameter ", i,
                        ": a tensor-parallel block must be 2-D, got block ", c10::IntArrayRef(global),
                        " of matrix ", c10::IntArrayRef(tp.global_shape()));
      TORCH_CHECK_VALUE(tp.partition_dim() == 0 || tp.partition_dim() == 1, kWho, "parameter ", i,
                        ": partition_dim must be 0 or 1, got ", tp.partition_dim());
      TORCH_CHECK_VALUE(tp.group().valid(), kWho, "parameter ", i,
                        ": its tensor-parallel group is invalid (default-constructed)");
      const int64_t other = 1 - tp.partition_dim();
      TORCH_CHECK_VALUE(global[static_cast<size_t>(other)] == tp.global_shape()[static_cast<size_t>(other)],
                        kWho, "parameter ", i, ": block ", c10::IntArrayRef(global),
                        " does not match matrix ", c10::IntArrayRef(tp.global_shape()),
                        " outside partition dim ", tp.partition_dim());
      l.tp = true;
      l.tp_mode = shard.tp_mode();
      l.tp_dim = tp.partition_dim();
      l.tp_group = tp.group();
      if (l.tp_mode != TensorParallelMode::kBlockwise) {
        l.scale_rows = tp.global_shape()[0];
        l.scale_cols = tp.global_shape()[1];
      }
    }
    size_t g = 0;
    while (g < groups_.size() && !same_group(groups_[g], shard.group())) ++g;
    if (g == groups_.size()) {
      groups_.push_back(shard.group());
      members.emplace_back();
    }
    l.group_index = static_cast<int64_t>(g);
    members[g].push_back(i);
    layout_.push_back(std::move(l));
  }
  owners_.assign(layout_.size(), 0);
  std::string failure;  // the first disagreement of this rank's groups
  // Per group: agree on the parameters (count and global shapes), then
  // exchange the local row counts. Every mismatch raises on every rank.
  for (const auto g : c10::irange(groups_.size())) {
    const auto& group = groups_[g];
    uint64_t hash = detail::kFnvOffset;
    for (const auto i : members[g]) {
      hash = detail::fnv1a(hash, c10::str(c10::IntArrayRef(layout_[i].global_shape), ";"));
    }
    // Every rank of this group raises together here; in a 2-D layout their
    // tensor-parallel peers (in other groups) learn of it below.
    try {
      detail::check_all_ranks_agree(
          group, {static_cast<int64_t>(members[g].size()), detail::signature_value(hash)}, kWho,
          "[parameter count, global-shape signature] differ; every rank must describe the same "
          "parameters in the same order");
      check_ranks_agree(group, settings_items(options_, members[g], group_params, param_group_of,
                                              param_groups),
                        kWho, "every rank of a group must build ShardedMuon with the same "
                        "settings and parameter dtypes");
    } catch (const c10::ValueError& e) {
      if (failure.empty()) failure = e.what_without_backtrace();
      continue;
    }
    std::vector<int64_t> local;
    for (const auto i : members[g]) local.push_back(group_params[i].size(0));
    const auto rows = group.all_gather_ints(local);
    std::vector<double> costs;  // of the members that have an owner
    std::vector<size_t> owned;
    for (const auto k : c10::irange(members[g].size())) {
      auto& l = layout_[members[g][k]];
      int64_t offset = 0;
      for (const auto r : c10::irange(rows.size())) {
        l.rows_per_rank.push_back(rows[r][k]);
        l.offsets.push_back(offset);
        offset += rows[r][k];
      }
      TORCH_CHECK_VALUE(offset >= l.global_shape[0], kWho, "parameter ", members[g][k],
                        ": the ranks of group '", group.name(), "' hold ", offset,
                        " rows in all, fewer than the global ", l.global_shape[0]);
      if (l.experts) {
        owners_[members[g][k]] = -1;  // every rank orthogonalizes its own experts
        continue;
      }
      owned.push_back(members[g][k]);
      // TP blocks: the whole matrix's cost, the same on every TP rank, so
      // that the blocks of one matrix get the same data-parallel owner.
      costs.push_back(l.tp ? newton_schulz_cost(l.scale_rows, l.scale_cols) + static_cast<double>(l.tp_mode)
                           : newton_schulz_cost(l.rows, l.cols));
    }
    const auto owners = assign_owners(costs, group.size());
    for (const auto k : c10::irange(owned.size())) owners_[owned[k]] = owners[k];
  }
  // In a 2-D layout the TP groups learn of a disagreement first, so that no
  // rank goes on to wait for a tensor-parallel peer that raised.
  std::vector<const Group*> tp_groups;
  std::set<std::string> seen;
  for (const auto& l : layout_) {
    if (l.tp && seen.insert(l.tp_group.name()).second) tp_groups.push_back(&l.tp_group);
  }
  detail::raise_together(failure, tp_groups, kWho, "data-parallel group");
  // 2-D layouts: the TP ranks exchange block sizes and agree on the matrix.
  for (const auto i : c10::irange(layout_.size())) {
    auto& l = layout_[i];
    if (!l.tp) continue;
    const auto& tp = shards[i].tp();
    const std::vector<int64_t> mine{l.global_shape[static_cast<size_t>(l.tp_dim)], tp.global_shape()[0],
                                    tp.global_shape()[1], l.tp_dim, static_cast<int64_t>(l.tp_mode),
                                    owners_[i]};
    const auto all = l.tp_group.all_gather_ints(mine);
    int64_t total = 0;
    for (const auto r : c10::irange(all.size())) {
      TORCH_CHECK_VALUE(std::equal(all[r].begin() + 1, all[r].end(), mine.begin() + 1), kWho,
                        "parameter ", i, ": tensor-parallel rank ", r, " describes matrix (",
                        all[r][1], ", ", all[r][2], ") split on dim ", all[r][3], " mode ",
                        all[r][4], " owner ", all[r][5], ", rank ", l.tp_group.rank(), " (",
                        mine[1], ", ", mine[2], ") dim ", mine[3], " mode ", mine[4], " owner ",
                        mine[5], "; every TP rank must describe the same matrix and layout");
      l.tp_sizes.push_back(all[r][0]);
      total += all[r][0];
    }
    TORCH_CHECK_VALUE(total == tp.global_shape()[static_cast<size_t>(l.tp_dim)], kWho, "parameter ",
                      i, ": the tensor-parallel blocks add up to ", total, " along dim ", l.tp_dim,
                      ", the matrix has ", tp.global_shape()[static_cast<size_t>(l.tp_dim)]);
    std::vector<AgreementItem> settings;
    detail::append_option_items(settings, param_groups[l.param_group].options(),
                                c10::str("the param group of parameter ", i));
    check_ranks_agree(l.tp_group, settings, kWho,
                      "every tensor-parallel rank of a matrix must build ShardedMuon with the "
                      "same settings");
  }
}

size_t ShardedOrthogonalizer::index_of(const at::Tensor& param) const {
  const auto it = index_.find(param.unsafeGetTensorImpl());
  TORCH_CHECK_VALUE(it != index_.end(), kWho, "a parameter of shape ", param.sizes(),
                    " was not given at construction; parameters and groups cannot be added");
  return it->second;
}

std::vector<at::Tensor> ShardedOrthogonalizer::orthogonalize(
    const std::vector<size_t>& members, const std::vector<at::Tensor>& matrices,
    const NewtonSchulzOptions& ns) const {
  const auto& first = layout_[members[0]];
  bool same_shape = true;
  for (const auto& m : matrices) same_shape = same_shape && m.sizes() == matrices[0].sizes();
  if ((!first.tp || first.tp_mode == TensorParallelMode::kBlockwise) && same_shape) {
    return newton_schulz(at::stack(matrices), ns).unbind(0);  // one batched call
  }
  std::vector<at::Tensor> out;
  for (const auto k : c10::irange(members.size())) {
    const auto& l = layout_[members[k]];
    if (!l.tp) {
      out.push_back(newton_schulz(matrices[k], ns));
    } else {
      out.push_back(
          detail::orthogonalize_block(matrices[k], l.tp_mode, l.tp_dim, l.tp_group, l.tp_sizes, ns));
    }
  }
  return out;
}

void ShardedOrthogonalizer::begin_step(const std::vector<OptimizerParamGroup>& param_groups) {
  size_t count = 0;
  for (const auto& g : param_groups) count += g.params().size();
  TORCH_CHECK_VALUE(count == layout_.size(), kWho, "has ", count, " parameters, was built with ",
                    layout_.size(), "; parameters and groups cannot be added");
  // Which parameters step: those with a gradient, the same on every rank.
  for (const auto g : c10::irange(groups_.size())) {
    std::vector<int64_t> mask;
    for (const auto i : c10::irange(layout_.size())) {
      if (layout_[i].group_index == static_cast<int64_t>(g)) {
        mask.push_back(params_[i].grad().defined());
      }
    }
    detail::check_all_ranks_agree(groups_[g], mask, kWho,
                                  "the ranks differ in which parameters have a gradient (1: has "
                                  "one); each must have one on every rank of its group or on none");
  }
}

void ShardedOrthogonalizer::orthogonalize(std::vector<OrthogonalizeItem>& items) {
  // By parameter, in the flat order every rank shares.
  std::vector<OrthogonalizeItem*> by_param(layout_.size(), nullptr);
  for (auto& item : items) {
    const size_t i = index_of(item.param);
    TORCH_INTERNAL_ASSERT(by_param[i] == nullptr, "a parameter was stepped twice in one batch");
    by_param[i] = &item;
    const auto& l = layout_[i];
    item.rows = l.scale_rows;
    item.cols = l.scale_cols;
    item.alpha = scale_factor(l.scale_rows, l.scale_cols, item.options->scale_mode(),
                              item.options->extra_scale_factor());
  }
  std::vector<size_t> active;  // matrices split over ranks
  std::vector<size_t> experts;  // stacked experts: whole on their rank
  for (const auto i : c10::irange(layout_.size())) {
    if (by_param[i] == nullptr) continue;
    (layout_[i].experts ? experts : active).push_back(i);
  }
  step_experts(experts, by_param);
  if (options_.mode() == ShardedMode::kReplicated) {
    step_replicated(active, by_param);
  } else {
    step_owner_compute(active, by_param);
  }
}

void ShardedOrthogonalizer::sum_parts(const OrthogonalizeItem& item, at::Tensor& partial,
                                      PartSum what) const {
  const auto& l = layout_[index_of(item.param)];
  // Stacked experts are whole matrices on their rank: nothing to sum.
  if (l.experts) return;
  // Rows are whole on their rank; the matrix spans the group's ranks.
  if (what == PartSum::kWholeMatrix) groups_[static_cast<size_t>(l.group_index)].all_reduce_(partial);
  if (l.tp) detail::sum_block_parts(partial, what, l.tp_mode, l.tp_dim, l.tp_group);
}

void ShardedOrthogonalizer::step_experts(const std::vector<size_t>& experts,
                                         std::vector<OrthogonalizeItem*>& items) const {
  // This rank's experts that exist (padding experts past E get a zero
  // update, as padding rows do), through the single-process strategy:
  // batched by shape and Newton–Schulz options, scaled from (out, in...).
  std::vector<OrthogonalizeItem> local;
  std::vector<size_t> of_local;
  for (const auto i : experts) {
    auto& item = *items[i];
    const auto& l = layout_[i];
    const auto rank = static_cast<size_t>(groups_[static_cast<size_t>(l.group_index)].rank());
    const int64_t held = item.param.size(0);
    const int64_t real = std::clamp<int64_t>(l.global_shape[0] - l.offsets[rank], 0, held);
    if (real < held || real == 0) item.orth = at::zeros_like(item.update, at::MemoryFormat::Contiguous);
    if (real == 0) continue;  // no expert of its own (an empty shard, or padding only)
    local.push_back(item);
    if (real < held) {
      local.back().param = item.param.narrow(0, 0, real);
      local.back().update = item.update.narrow(0, 0, real);
    }
    of_local.push_back(i);
  }
  if (local.empty()) return;
  make_local_orthogonalizer()->orthogonalize(local);
  for (const auto k : c10::irange(local.size())) {
    auto& item = *items[of_local[k]];
    const auto& part = local[k];
    if (part.param.size(0) < item.param.size(0)) {  // padding experts follow, left zero
      item.orth.narrow(0, 0, part.param.size(0)).copy_(part.orth.reshape(part.param.sizes()));
    } else {
      item.orth = part.orth;
    }
    item.alpha = part.alpha;
    item.rows = part.rows;
    item.cols = part.cols;
  }
}

void ShardedOrthogonalizer::step_replicated(const std::vector<size_t>& active,
                                            std::vector<OrthogonalizeItem*>& items) {
  for (const auto i : active) {
    auto& item = *items[i];
    const auto& l = layout_[i];
    const auto& group = groups_[static_cast<size_t>(l.group_index)];
    const auto parts = group.all_gather_uneven(item.update.reshape({item.update.size(0), l.cols}));
    const auto full = at::cat(parts).narrow(0, 0, l.rows);
    const auto orth = orthogonalize({i}, {full}, item.options->ns())[0];
    const auto rank = static_cast<size_t>(group.rank());
    item.orth = rows_padded(orth, l.offsets[rank], l.rows_per_rank[rank]);
  }
}

void ShardedOrthogonalizer::step_owner_compute(const std::vector<size_t>& active,
                                               std::vector<OrthogonalizeItem*>& items) {
  auto update = [&](size_t i) -> const at::Tensor& { return items[i]->update; };
  for (const auto g : c10::irange(groups_.size())) {
    const auto& group = groups_[g];
    const int world = group.size();
    const auto me = static_cast<size_t>(group.rank());
    // Batches: same (rows, cols, dtype), in order of first appearance.
    std::vector<std::vector<size_t>> batches;
    // TP blocks batch by their whole matrix and layout, so that every TP rank
    // forms the same batches in the same order (their blocks may differ).
    std::map<std::tuple<size_t, int64_t, int64_t, int, int64_t, int64_t, int64_t>, size_t> batch_of;
    for (const auto i : active) {
      const auto& l = layout_[i];
      if (l.group_index != static_cast<int64_t>(g)) continue;
      const size_t pg = l.param_group;
      const auto key = l.tp ? std::make_tuple(pg, l.scale_rows, l.scale_cols,
                                              static_cast<int>(update(i).scalar_type()), int64_t{1},
                                              static_cast<int64_t>(l.tp_mode), l.tp_dim)
                            : std::make_tuple(pg, l.rows, l.cols, static_cast<int>(update(i).scalar_type()),
                                              int64_t{0}, int64_t{0}, int64_t{0});
      const auto [it, fresh] = batch_of.emplace(key, batches.size());
      if (fresh) batches.emplace_back();
      batches[it->second].push_back(i);
    }
    const auto nb = batches.size();

    // Forward: my shard of each matrix to its owner.
    auto start_forward = [&](size_t b) {
      const auto& batch = batches[b];
      std::vector<int64_t> send(static_cast<size_t>(world), 0);
      std::vector<int64_t> recv(static_cast<size_t>(world), 0);
      std::vector<at::Tensor> pieces;
      for (int d = 0; d < world; ++d) {
        for (const auto i : batch) {
          if (owners_[i] != d) continue;
          pieces.push_back(update(i).reshape({-1}));
          send[static_cast<size_t>(d)] += update(i).numel();
        }
      }
      for (const auto i : batch) {
        if (owners_[i] != static_cast<int64_t>(me)) continue;
        for (int s = 0; s < world; ++s) {
          recv[static_cast<size_t>(s)] += layout_[i].rows_per_rank[static_cast<size_t>(s)] * layout_[i].cols;
        }
      }
      auto input = pieces.empty() ? at::empty({0}, update(batch[0]).options()) : at::cat(pieces);
      return group.all_to_all_async(input, send, recv);
    };
    // Owner: assemble, orthogonalize as one batch, send each rank its rows.
    auto orthogonalize_and_return = [&](size_t b, const at::Tensor& received) {
      const auto& batch = batches[b];
      std::vector<size_t> mine;
      for (const auto i : batch) {
        if (owners_[i] == static_cast<int64_t>(me)) mine.push_back(i);
      }
      // received: for each source rank s, for each of my matrices, its rows from s.
      std::vector<std::vector<at::Tensor>> blocks(mine.size());
      int64_t offset = 0;
      for (int s = 0; s < world; ++s) {
        for (const auto k : c10::irange(mine.size())) {
          const auto& l = layout_[mine[k]];
          const int64_t rows = l.rows_per_rank[static_cast<size_t>(s)];
          blocks[k].push_back(received.narrow(0, offset, rows * l.cols).view({rows, l.cols}));
          offset += rows * l.cols;
        }
      }
      std::vector<int64_t> send(static_cast<size_t>(world), 0);
      std::vector<int64_t> recv(static_cast<size_t>(world), 0);
      std::vector<at::Tensor> out_pieces;
      if (!mine.empty()) {
        std::vector<at::Tensor> full;
        for (const auto k : c10::irange(mine.size())) {
          full.push_back(at::cat(blocks[k]).narrow(0, 0, layout_[mine[k]].rows));
        }
        const auto orth = orthogonalize(mine, full, items[mine[0]]->options->ns());
        for (int s = 0; s < world; ++s) {
          for (const auto k : c10::irange(mine.size())) {
            const auto& l = layout_[mine[k]];
            const auto rs = static_cast<size_t>(s);
            out_pieces.push_back(rows_padded(orth[k], l.offsets[rs], l.rows_per_rank[rs]).reshape({-1}));
            send[rs] += l.rows_per_rank[rs] * l.cols;
          }
        }
      }
      for (const auto i : batch) {
        recv[static_cast<size_t>(owners_[i])] += params_[i].size(0) * layout_[i].cols;
      }
      auto input = out_pieces.empty() ? at::empty({0}, received.options()) : at::cat(out_pieces);
      return group.all_to_all_async(input, send, recv);
    };
    // Everyone: the returned rows of every matrix of the batch.
    auto apply = [&](size_t b, const at::Tensor& returned) {
      const auto& batch = batches[b];
      int64_t offset = 0;
      for (int d = 0; d < world; ++d) {
        for (const auto i : batch) {
          if (owners_[i] != d) continue;
          const int64_t n = params_[i].size(0) * layout_[i].cols;
          items[i]->orth = returned.narrow(0, offset, n);
          offset += n;
        }
      }
    };

    const size_t ahead = static_cast<size_t>(options_.max_in_flight());
    std::deque<PendingCollective> forward;
    std::deque<std::pair<size_t, PendingCollective>> backward;
    size_t launched = 0;
    auto launch_forward_upto = [&](size_t limit) {
      while (launched < nb && launched < limit) forward.push_back(start_forward(launched++));
    };
    launch_forward_upto(1 + ahead);
    for (size_t b = 0; b < nb; ++b) {
      const auto received = forward.front().wait()[0];
      forward.pop_front();
      launch_forward_upto(b + 2 + ahead);  // keep the next batches travelling
      backward.emplace_back(b, orthogonalize_and_return(b, received));
      while (backward.size() > std::max<size_t>(ahead, 1)) {
        auto [done, pending] = std::move(backward.front());
        backward.pop_front();
        apply(done, pending.wait()[0]);
      }
    }
    while (!backward.empty()) {
      auto [done, pending] = std::move(backward.front());
      backward.pop_front();
      apply(done, pending.wait()[0]);
    }
  }
}

at::Tensor local_rows(const at::Tensor& full, const std::vector<int64_t>& rows_per_rank, int rank) {
  TORCH_CHECK_VALUE(rank >= 0 && static_cast<size_t>(rank) < rows_per_rank.size(),
                    "[muon::dist::local_rows] rank ", rank, " of ", rows_per_rank.size());
  const int64_t offset = std::accumulate(rows_per_rank.begin(), rows_per_rank.begin() + rank, int64_t{0});
  const int64_t count = rows_per_rank[static_cast<size_t>(rank)];
  auto sizes = full.sizes().vec();
  sizes[0] = count;
  auto out = at::zeros(sizes, full.options());
  const int64_t end = std::min(offset + count, full.size(0));
  if (end > offset) out.narrow(0, 0, end - offset).copy_(full.narrow(0, offset, end - offset));
  return out;
}

at::Tensor reduce_scatter_rows(const at::Tensor& full, const std::vector<int64_t>& rows_per_rank,
                               const Group& group) {
  TORCH_CHECK_VALUE(static_cast<int>(rows_per_rank.size()) == group.size(),
                    "[muon::dist::reduce_scatter_rows] rows_per_rank has ", rows_per_rank.size(),
                    " entries for a group of ", group.size());
  // Gloo has no reduce-scatter on CPU tensors: all-reduce, then keep our rows.
  auto sum = full.detach().clone();
  group.all_reduce_(sum);
  sum.div_(group.size());
  return local_rows(sum, rows_per_rank, group.rank());
}

MuonFactory sharded_muon_factory(ShardedOptions options) {
  return [options](std::vector<OptimizerParamGroup> param_groups,
                   const MuonOptions& defaults) -> std::unique_ptr<Muon> {
    return std::make_unique<ShardedMuon>(std::move(param_groups), defaults, options);
  };
}

std::pair<int64_t, int64_t> ShardedOrthogonalizer::max_over_processes(int64_t code) const {
  // Every group a step communicates over: the shard groups, then the TP
  // groups of a 2-D layout, each once, in the order every rank shares.
  std::vector<const Group*> groups;
  std::set<std::string> seen;
  for (const auto& g : groups_) {
    if (seen.insert(g.name()).second) groups.push_back(&g);
  }
  for (const auto& l : layout_) {
    if (l.tp && seen.insert(l.tp_group.name()).second) groups.push_back(&l.tp_group);
  }
  return detail::max_over_groups(groups, code);
}

}  // namespace muon::dist
