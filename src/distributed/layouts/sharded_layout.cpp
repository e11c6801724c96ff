// The row-shard layout of ShardedOrthogonalizer, made by attach: each
// parameter's shard checked and placed (stacked experts, tensor-parallel
// blocks of a 2-D layout), the ranks of each group agreeing on parameters
// and settings, the rows each rank holds and each matrix's owner.
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "distributed/runtime/agreement.h"
#include "muon/distributed/layouts/assignment.h"
#include "muon/distributed/layouts/sharded_muon.h"
#include "muon/scaling.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = detail::kShardedWho;

using torch::optim::OptimizerParamGroup;

bool same_group(const Group& a, const Group& b) {
  return a.name() == b.name() && a.world_ranks() == b.world_ranks();
}

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
    const auto& shard = shards[i];
    auto l = layout_of(i, group_params[i], shard, param_groups[param_group_of[i]], param_group_of[i]);
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
    place_rows(g, members[g], group_params);
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
  check_tensor_parallel(shards, param_groups);
  // num_heads against the whole shapes, now known (the same on every rank).
  for (const auto gi : c10::irange(param_groups.size())) {
    if (const auto* o = dynamic_cast<const MuonOptions*>(&param_groups[gi].options()))
      check_options(*o, gi);
  }
}

ShardedOrthogonalizer::Layout ShardedOrthogonalizer::layout_of(size_t i, const at::Tensor& p,
                                                               const RowShard& shard,
                                                               const OptimizerParamGroup& param_group,
                                                               size_t param_group_index) {
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
  l.param_group = param_group_index;
  l.global_shape = global;
  std::tie(l.rows, l.cols) = matrix_dims(c10::IntArrayRef(global));
  l.scale_rows = l.rows;
  l.scale_cols = l.cols;
  l.matrix_rows = l.rows;
  const auto* o = dynamic_cast<const MuonOptions*>(&param_group.options());
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
    l.matrix_rows = tp.global_shape()[0];
    if (l.tp_mode != TensorParallelMode::kBlockwise) {
      l.scale_rows = tp.global_shape()[0];
      l.scale_cols = tp.global_shape()[1];
    }
  }
  return l;
}

void ShardedOrthogonalizer::place_rows(size_t g, const std::vector<size_t>& members,
                                       const std::vector<at::Tensor>& params) {
  const auto& group = groups_[g];
  std::vector<int64_t> local;
  for (const auto i : members) local.push_back(params[i].size(0));
  const auto rows = group.all_gather_ints(local);
  std::vector<double> costs;  // of the members that have an owner
  std::vector<size_t> owned;
  for (const auto k : c10::irange(members.size())) {
    auto& l = layout_[members[k]];
    int64_t offset = 0;
    for (const auto r : c10::irange(rows.size())) {
      l.rows_per_rank.push_back(rows[r][k]);
      l.offsets.push_back(offset);
      offset += rows[r][k];
    }
    TORCH_CHECK_VALUE(offset >= l.global_shape[0], kWho, "parameter ", members[k],
                      ": the ranks of group '", group.name(), "' hold ", offset,
                      " rows in all, fewer than the global ", l.global_shape[0]);
    if (l.experts) {
      owners_[members[k]] = -1;  // every rank orthogonalizes its own experts
      continue;
    }
    owned.push_back(members[k]);
    // TP blocks: the whole matrix's cost, the same on every TP rank, so
    // that the blocks of one matrix get the same data-parallel owner.
    costs.push_back(l.tp ? newton_schulz_cost(l.scale_rows, l.scale_cols) + static_cast<double>(l.tp_mode)
                         : newton_schulz_cost(l.rows, l.cols));
  }
  const auto owners = assign_owners(costs, group.size());
  for (const auto k : c10::irange(owned.size())) owners_[owned[k]] = owners[k];
}

void ShardedOrthogonalizer::check_tensor_parallel(const std::vector<RowShard>& shards,
                                                  const std::vector<OptimizerParamGroup>& param_groups) {
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

}  // namespace muon::distributed
