// Muon over row-sharded parameters: owner-compute or replicated orthogonalization.
// Here: the modes and options, ShardedMuon, and ShardedOrthogonalizer's
// step (which parameters step, stacked experts, the replicated mode, the
// sums over parts); its layout is made in sharded_layout.cpp, its
// owner-compute step in sharded_owner_compute.cpp.
#include "muon/distributed/layouts/sharded_muon.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <unordered_map>
#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "muon/distributed/layouts/owner_compute.h"
#include "distributed/layouts/tensor_parallel_block.h"
#include "distributed/runtime/agreement.h"
#include "distributed/runtime/max_over.h"
#include "muon/newton_schulz.h"
#include "muon/scaling.h"
#include "util/names.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = detail::kShardedWho;

using torch::optim::OptimizerParamGroup;

constexpr muon::detail::EnumName<ShardedMode> kModes[] = {
    {ShardedMode::kOwnerCompute, "owner_compute"}, {ShardedMode::kReplicated, "replicated"}};

}  // namespace

namespace detail {

at::Tensor rows_padded(const at::Tensor& matrix, int64_t offset, int64_t count) {
  const int64_t m = matrix.size(0);
  auto out = at::zeros({count, matrix.size(1)}, matrix.options());
  const int64_t begin = std::min(offset, m);
  const int64_t end = std::min(offset + count, m);
  if (end > begin) out.narrow(0, 0, end - begin).copy_(matrix.narrow(0, begin, end - begin));
  return out;
}

}  // namespace detail

MUON_DEFINE_ENUM_NAMES(ShardedMode, parse_sharded_mode, kModes, kWho, "sharded mode");

ShardedOptions& ShardedOptions::mode(const std::string& name) {
  mode_ = parse_sharded_mode(name);
  return *this;
}

ShardedOptions& ShardedOptions::shard(const at::Tensor& param, RowShard shard) {
  TORCH_CHECK_VALUE(param.defined(), kWho, "shard: param is undefined");
  shards_.emplace_back(param, std::move(shard));
  return *this;
}

ShardedOptions detail::with_shards(const char* who, ShardedOptions options, const std::vector<at::Tensor>& params,
                                   std::vector<RowShard> shards) {
  TORCH_CHECK_VALUE(shards.size() == params.size(), who, "got ", shards.size(), " shard descriptions for ",
                    params.size(), " parameters");
  for (const auto i : c10::irange(params.size())) options.shard(params[i], std::move(shards[i]));
  return options;
}

void detail::check_owner_compute_shards(const ShardedOptions& options, const std::vector<OptimizerParamGroup>& groups,
                                        const char* who, const char* optimizer, const char* state,
                                        const char* needs) {
  TORCH_CHECK_VALUE(options.mode() == ShardedMode::kOwnerCompute, who, "optimizer '", optimizer,
                    "' runs in the sharded layout in mode owner_compute only, got '", to_string(options.mode()),
                    "' (each matrix's ", state, " stays with one owner)");
  std::unordered_map<const void*, const RowShard*> shard_of;
  for (const auto& [param, shard] : options.shards()) shard_of.emplace(param.unsafeGetTensorImpl(), &shard);
  for (const auto g : c10::irange(groups.size())) {
    for (const auto j : c10::irange(groups[g].params().size())) {
      const auto it = shard_of.find(groups[g].params()[j].unsafeGetTensorImpl());
      if (it == shard_of.end()) continue;  // named by the strategy's own check
      const auto& shard = *it->second;
      TORCH_CHECK_VALUE(shard.global_shape().size() >= 2, who, "parameter ", j, " of group ", g, " has global shape ",
                        c10::IntArrayRef(shard.global_shape()), "; '", optimizer,
                        "' steps matrices (give 1-D parameters to the scalar optimizer)");
      TORCH_CHECK_VALUE(!shard.has_tensor_parallel(), who, "parameter ", j, " of group ", g,
                        " is a tensor-parallel block (the 2-D layout); optimizer '", optimizer, "' ", needs,
                        " and does not run on them");
    }
  }
}

std::shared_ptr<ShardedOrthogonalizer> detail::owner_compute_strategy(ShardedOptions options,
                                                                      std::vector<OptimizerParamGroup>& groups,
                                                                      const char* who, const char* optimizer,
                                                                      const char* state, const char* needs) {
  check_owner_compute_shards(options, groups, who, optimizer, state, needs);
  auto strategy = make_orthogonalizer(std::move(options));
  strategy->attach(groups);
  return strategy;
}

ShardedMuon::ShardedMuon(std::vector<at::Tensor> params, std::vector<RowShard> shards,
                         MuonOptions defaults, ShardedOptions options)
    : ShardedMuon(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                  detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

ShardedMuon::ShardedMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                         ShardedOptions options)
    : ShardedMuon(std::move(param_groups), std::move(defaults),
                  make_orthogonalizer(std::move(options))) {}

ShardedMuon::ShardedMuon(std::vector<OptimizerParamGroup> param_groups, MuonOptions defaults,
                         std::shared_ptr<ShardedOrthogonalizer> strategy)
    : Muon(std::move(param_groups), std::move(defaults), strategy), strategy_(std::move(strategy)) {}

std::string ShardedMuon::archive_kind() const { return "muon::distributed::ShardedMuon"; }

// ---- the strategy ------------------------------------------------------------

ShardedOrthogonalizer::ShardedOrthogonalizer(ShardedOptions options)
    : Orthogonalizer(Traits{/*empty_parts=*/true, /*fuses=*/false, /*call_elements=*/-1}),
      options_(std::move(options)) {
  TORCH_CHECK_VALUE(options_.max_in_flight() >= 0, kWho, "max_in_flight must be >= 0, got ",
                    options_.max_in_flight());
}

std::shared_ptr<ShardedOrthogonalizer> make_orthogonalizer(ShardedOptions options) {
  return std::make_shared<ShardedOrthogonalizer>(std::move(options));
}

void ShardedOrthogonalizer::check_options(const MuonOptions& o, size_t group) const {
  check_spectral_options_need_whole_matrices(o, group, kWho, name());
  TORCH_CHECK_VALUE(o.split_sizes().empty(), kWho, "param group ", group,
                    ": split_sizes (fused QKV) is not supported on row shards");
  // num_heads: the whole matrix (the owner's, or every rank's after the
  // gather) splits into heads; a tensor-parallel row split must keep whole
  // heads on each tensor-parallel rank.
  for (const auto i : c10::irange(layout_.size())) {
    const auto& l = layout_[i];
    if (o.num_heads() <= 1 || l.param_group != group || l.experts) continue;
    const auto problem =
        detail::head_split_problem(o.num_heads(), l.matrix_rows, l.tp ? l.tp_dim : 1,
                                   l.tp ? l.tp_sizes : std::vector<int64_t>{});
    TORCH_CHECK_VALUE(problem.empty(), kWho, "param group ", group, ", parameter ", i,
                      " (global shape ", c10::IntArrayRef(l.global_shape), "): ", problem);
  }
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

size_t ShardedOrthogonalizer::index_of(const at::Tensor& param) const {
  const auto it = index_.find(param.unsafeGetTensorImpl());
  TORCH_CHECK_VALUE(it != index_.end(), kWho, "a parameter of shape ", param.sizes(),
                    " was not given at construction; parameters and groups cannot be added");
  return it->second;
}

std::vector<at::Tensor> ShardedOrthogonalizer::orthogonalize(
    const std::vector<size_t>& members, const std::vector<at::Tensor>& matrices,
    const MuonOptions& o) const {
  const auto& ns = o.ns();
  const auto& first = layout_[members[0]];
  bool same_shape = true;
  for (const auto& m : matrices) same_shape = same_shape && m.sizes() == matrices[0].sizes();
  const int64_t heads = o.num_heads() > 1 ? o.num_heads() : 1;
  if (heads > 1) {
    // Per head block: every rank of a row split holds whole heads
    // (check_options), so each head is orthogonalized where it lies, as one
    // process orthogonalizes it.
    std::vector<at::Tensor> out;
    for (const auto k : c10::irange(members.size())) {
      const auto& l = layout_[members[k]];
      if (!l.tp) {
        const int64_t head_rows = l.rows / heads;
        const auto& m = matrices[k];
        out.push_back(newton_schulz(m.reshape({heads, head_rows, m.size(1)}), ns).view(m.sizes()));
      } else {
        out.push_back(detail::orthogonalize_block_heads(
            matrices[k], l.tp_mode, l.tp_dim, l.tp_group, l.tp_sizes, ns, heads, l.matrix_rows));
      }
    }
    return out;
  }
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
    // With num_heads, each head block's shape: a head's rows.
    const int64_t heads =
        item.options->num_heads() > 1 && !l.experts ? item.options->num_heads() : 1;
    item.rows = heads > 1 ? l.matrix_rows / heads : l.scale_rows;
    item.cols = l.scale_cols;
    item.alpha = scale_factor(item.rows, l.scale_cols, item.options->scale_mode(),
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
    const auto orth = orthogonalize({i}, {full}, *item.options)[0];
    const auto rank = static_cast<size_t>(group.rank());
    item.orth = detail::rows_padded(orth, l.offsets[rank], l.rows_per_rank[rank]);
  }
}

at::Tensor local_rows(const at::Tensor& full, const std::vector<int64_t>& rows_per_rank, int rank) {
  TORCH_CHECK_VALUE(rank >= 0 && static_cast<size_t>(rank) < rows_per_rank.size(),
                    "[muon::distributed::local_rows] rank ", rank, " of ", rows_per_rank.size());
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
                    "[muon::distributed::reduce_scatter_rows] rows_per_rank has ", rows_per_rank.size(),
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

}  // namespace muon::distributed
