// Tensor-parallel Muon: duplicated, distributed and blockwise orthogonalization.
#include "muon/distributed/layouts/tensor_parallel.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <cmath>
#include <numeric>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "distributed/layouts/tensor_parallel_block.h"
#include "distributed/runtime/agreement.h"
#include "distributed/runtime/max_over.h"
#include "muon/compat.h"
#include "muon/scaling.h"
#include "util/names.h"

namespace muon::distributed {
namespace {

using torch::optim::OptimizerParamGroup;

constexpr const char* kWho = "[muon::distributed::TensorParallelMuon] ";

constexpr muon::detail::EnumName<TensorParallelMode> kModes[] = {
    {TensorParallelMode::kDuplicated, "duplicated"},
    {TensorParallelMode::kDistributed, "distributed"},
    {TensorParallelMode::kBlockwise, "blockwise"}};

const void* impl_key(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

}  // namespace

// ---- modes -------------------------------------------------------------------------

MUON_DEFINE_ENUM_NAMES(TensorParallelMode, parse_tensor_parallel_mode, kModes, kWho, "mode");

TensorParallelOptions& TensorParallelOptions::mode(const std::string& name) {
  mode_ = parse_tensor_parallel_mode(name);
  return *this;
}

TensorParallelOptions& TensorParallelOptions::shard(const at::Tensor& param,
                                                    TensorParallelShard shard) {
  TORCH_CHECK_VALUE(param.defined(), kWho, "shard: param is undefined");
  TORCH_CHECK_VALUE(shard.group().valid(), kWho,
                    "shard: the group is invalid (default-constructed); give the TP group "
                    "explicitly, there is no default");
  for (const auto& [p, s] : shards_) {
    TORCH_CHECK_VALUE(!p.is_same(param), kWho, "shard: a parameter of shape ", param.sizes(),
                      " is declared twice");
  }
  shards_.emplace_back(param, std::move(shard));
  return *this;
}

TensorParallelOptions& TensorParallelOptions::shard(
    const torch::OrderedDict<std::string, at::Tensor>& named_parameters, const std::string& name,
    TensorParallelShard shard) {
  const auto* p = named_parameters.find(name);
  TORCH_CHECK_VALUE(p != nullptr, kWho, "shard: no parameter named '", name, "' among ",
                    named_parameters.size(), " named parameters");
  return this->shard(*p, std::move(shard));
}

// ---- the strategy ------------------------------------------------------------------

at::Tensor detail::orthogonalize_block(const at::Tensor& block, TensorParallelMode mode,
                                       int64_t dim, const Group& group,
                                       const std::vector<int64_t>& sizes,
                                       const NewtonSchulzOptions& ns) {
  switch (mode) {
    case TensorParallelMode::kDuplicated: {
      const auto rank = static_cast<size_t>(group.rank());
      return newton_schulz(gather_blocks(block, dim, group), ns)
          .narrow(dim, split_offset(sizes, group.rank()), sizes[rank])
          .contiguous();
    }
    case TensorParallelMode::kDistributed:
      return distributed_newton_schulz(block, dim, group, ns);
    case TensorParallelMode::kBlockwise:
      if (block.numel() == 0) return at::zeros_like(block);  // an empty block
      return newton_schulz(block, ns);
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

std::string detail::head_split_problem(int64_t heads, int64_t matrix_rows, int64_t dim,
                                       const std::vector<int64_t>& sizes) {
  if (matrix_rows % heads != 0) {
    return c10::str("num_heads ", heads, " does not divide the matrix's ", matrix_rows, " rows");
  }
  const int64_t head_rows = matrix_rows / heads;
  if (dim != 0) return "";
  for (const auto s : sizes) {
    if (s % head_rows != 0) {
      return c10::str("num_heads ", heads, " gives heads of ", head_rows,
                      " rows, but the tensor-parallel blocks split the rows into ",
                      c10::IntArrayRef(sizes),
                      ", so a head straddles two ranks; per-head "
                      "Newton–Schulz needs whole heads on each rank (blocks of a multiple of ",
                      head_rows, " rows)");
    }
  }
  return "";
}

at::Tensor detail::orthogonalize_block_heads(const at::Tensor& block, TensorParallelMode mode,
                                             int64_t dim, const Group& group,
                                             const std::vector<int64_t>& sizes,
                                             const NewtonSchulzOptions& ns, int64_t heads,
                                             int64_t matrix_rows) {
  const int64_t head_rows = matrix_rows / heads;
  // This rank's heads, each a matrix of its own: (local heads, head rows, cols).
  const auto local_heads = [&](const at::Tensor& m) {
    if (m.numel() == 0) return at::zeros_like(m);
    return newton_schulz(m.reshape({m.size(0) / head_rows, head_rows, m.size(1)}), ns)
        .view(m.sizes());
  };
  if (dim == 0 || mode == TensorParallelMode::kBlockwise) return local_heads(block);
  if (mode == TensorParallelMode::kDuplicated) {
    const auto rank = static_cast<size_t>(group.rank());
    return local_heads(gather_blocks(block, dim, group))
        .narrow(dim, split_offset(sizes, group.rank()), sizes[rank])
        .contiguous();
  }
  std::vector<at::Tensor> out;
  for (int64_t h = 0; h < heads; ++h) {
    out.push_back(distributed_newton_schulz(block.narrow(0, h * head_rows, head_rows).contiguous(),
                                            dim, group, ns));
  }
  return at::cat(out, 0);
}

void detail::sum_block_parts(at::Tensor& partial, PartSum what, TensorParallelMode mode,
                             int64_t dim, const Group& group) {
  if (mode == TensorParallelMode::kBlockwise) return;  // each block is a matrix of its own
  if (what == PartSum::kWholeMatrix || dim == 1) group.all_reduce_(partial);
}

TensorParallelOrthogonalizer::TensorParallelOrthogonalizer(TensorParallelOptions tp)
    : Orthogonalizer(Traits{/*empty_parts=*/true, /*fuses=*/false, /*call_elements=*/0}),
      tp_(std::move(tp)),
      local_(make_local_orthogonalizer()) {}

void TensorParallelOrthogonalizer::attach(const std::vector<OptimizerParamGroup>& param_groups) {
  // Which declared shards are parameters of this optimizer, in group order.
  std::unordered_map<const void*, size_t> declared;
  for (size_t i = 0; i < tp_.shards().size(); ++i) declared[impl_key(tp_.shards()[i].first)] = i;
  std::vector<std::tuple<at::Tensor, const MuonOptions*, size_t, size_t>> sharded;
  wholes_.clear();
  for (const auto gi : c10::irange(param_groups.size())) {
    const auto& group = param_groups[gi];
    for (const auto j : c10::irange(group.params().size())) {
      const auto& p = group.params()[j];
      auto it = declared.find(impl_key(p));
      if (it == declared.end()) {
        TORCH_CHECK_VALUE(p.numel() > 0, kWho, "parameter ", j, " of group ", gi,
                          " has zero size (shape ", p.sizes(),
                          ") and is not a shard; only tensor-parallel blocks may be empty");
        wholes_.push_back(Whole{gi, j, p.sizes().vec()});
        continue;
      }
      sharded.emplace_back(p, static_cast<const MuonOptions*>(&group.options()), it->second, gi);
      declared.erase(it);
    }
  }
  TORCH_CHECK_VALUE(declared.empty(), kWho, declared.size(),
                    " parameter(s) declared as shards are not parameters of this optimizer "
                    "(first: shape ",
                    tp_.shards()[declared.begin()->second].first.sizes(), ")");

  // One exchange per sharded parameter over its group. Local problems travel
  // as a flag, so every rank of the group raises together instead of some
  // raising and the rest waiting in the next collective.
  const auto mode = static_cast<int64_t>(tp_.mode());
  for (size_t i = 0; i < sharded.size(); ++i) {
    const auto& p = std::get<0>(sharded[i]);
    const auto& o = *std::get<1>(sharded[i]);
    const auto& shard = tp_.shards()[std::get<2>(sharded[i])].second;
    const auto& g = shard.group();
    std::ostringstream local_error;
    const auto& gs = shard.global_shape();
    const int64_t dim = shard.partition_dim();
    if (gs.size() != 2 || gs[0] < 1 || gs[1] < 1) {
      local_error << "global_shape must be 2-D with positive sizes, got " << c10::IntArrayRef(gs);
    } else if (dim != 0 && dim != 1) {
      local_error << "partition_dim must be 0 or 1, got " << dim;
    } else if (p.dim() != 2) {
      local_error << "a sharded parameter must be 2-D, got shape " << p.sizes();
    } else if (p.size(1 - dim) != gs[static_cast<size_t>(1 - dim)]) {
      local_error << "block shape " << p.sizes() << " does not match global_shape "
                  << c10::IntArrayRef(gs) << " in dim " << 1 - dim;
    } else if (!o.split_sizes().empty() || o.stacked_experts()) {
      local_error << "split_sizes and stacked_experts are not supported on sharded parameters";
    }
    const bool ok = local_error.str().empty();
    const std::vector<int64_t> mine{ok ? 1 : 0,
                                    gs.size() == 2 ? gs[0] : -1,
                                    gs.size() == 2 ? gs[1] : -1,
                                    dim,
                                    p.dim() == 2 ? p.size(0) : -1,
                                    p.dim() == 2 ? p.size(1) : -1,
                                    mode};
    const auto all = g.all_gather_ints(mine);
    const std::string where = c10::str("sharded parameter ", i, " (block shape ", p.sizes(),
                                       ") over group '", g.name(), "' (rank ", g.rank(), " of ",
                                       g.size(), "): ");
    TORCH_CHECK_VALUE(ok, kWho, where, local_error.str());
    std::ostringstream table;
    for (size_t r = 0; r < all.size(); ++r) {
      table << "\n  rank " << r << ": global_shape [" << all[r][1] << ", " << all[r][2]
            << "], partition_dim " << all[r][3] << ", block [" << all[r][4] << ", " << all[r][5]
            << "], mode " << to_string(static_cast<TensorParallelMode>(all[r][6]))
            << (all[r][0] ? "" : " (invalid on that rank)");
    }
    int64_t total = 0;
    std::vector<int64_t> sizes;
    for (const auto& d : all) {
      TORCH_CHECK_VALUE(d[0] == 1, kWho, where, "another rank reported an invalid shard:",
                        table.str());
      TORCH_CHECK_VALUE(d[1] == mine[1] && d[2] == mine[2] && d[3] == mine[3] && d[6] == mine[6],
                        kWho, where,
                        "the ranks disagree on global_shape, partition_dim or mode:", table.str());
      sizes.push_back(d[static_cast<size_t>(4 + dim)]);
      total += sizes.back();
    }
    TORCH_CHECK_VALUE(total == gs[static_cast<size_t>(dim)], kWho, where, "the blocks' sizes in dim ",
                      dim, " sum to ", total, ", global_shape has ",
                      gs[static_cast<size_t>(dim)], ":", table.str());
    // Every setting of the step (lr, momentum, Newton–Schulz, ...), so that
    // the ranks of a block do not update their parts of one matrix differently.
    std::vector<AgreementItem> settings;
    detail::append_option_items(settings, o, c10::str("the param group of sharded parameter ", i));
    check_ranks_agree(g, settings, kWho,
                      "every rank of a tensor-parallel group must build Muon with the same "
                      "settings");
    const int64_t offset = split_offset(sizes, g.rank());
    layouts_.emplace(impl_key(p), Layout{shard, std::move(sizes), offset, std::get<3>(sharded[i])});
  }
  // The same on every rank of a shard's group (agreed above): all raise together.
  for (const auto gi : c10::irange(param_groups.size())) {
    check_heads(static_cast<const MuonOptions&>(param_groups[gi].options()), gi);
  }
}

void TensorParallelOrthogonalizer::check_heads(const MuonOptions& o, size_t group) const {
  if (o.num_heads() <= 1) return;
  for (const auto& w : wholes_) {
    if (w.param_group != group || w.shape.size() != 2) continue;
    TORCH_CHECK_VALUE(w.shape[0] % o.num_heads() == 0, kWho, "param group ", group, ": num_heads ",
                      o.num_heads(), " must divide the rows of parameter ", w.index,
                      ", which has shape ", c10::IntArrayRef(w.shape));
  }
  for (const auto& [key, l] : layouts_) {
    if (l.param_group != group) continue;
    const auto& gs = l.shard.global_shape();
    const auto problem =
        detail::head_split_problem(o.num_heads(), gs[0], l.shard.partition_dim(), l.sizes);
    TORCH_CHECK_VALUE(problem.empty(), kWho, "param group ", group,
                      ", sharded parameter of global shape ", c10::IntArrayRef(gs),
                      " (partition_dim ", l.shard.partition_dim(), "): ", problem);
  }
}

const TensorParallelOrthogonalizer::Layout* TensorParallelOrthogonalizer::layout_of(
    const at::Tensor& param) const {
  const auto it = layouts_.find(impl_key(param));
  return it == layouts_.end() ? nullptr : &it->second;
}

std::vector<int64_t> TensorParallelOrthogonalizer::block_sizes(const at::Tensor& param) const {
  const auto* layout = layout_of(param);
  return layout == nullptr ? std::vector<int64_t>{} : layout->sizes;
}

void TensorParallelOrthogonalizer::begin_step(const std::vector<OptimizerParamGroup>& groups) {
  // The shards this optimizer steps, grouped by their group in declaration
  // order (the same on every rank): 1 where the block has a gradient.
  std::set<const void*> mine;
  for (const auto& g : groups) {
    for (const auto& p : g.params()) mine.insert(impl_key(p));
  }
  std::vector<const Group*> order;
  std::map<std::string, std::vector<int64_t>> masks;
  for (const auto& [param, shard] : tp_.shards()) {
    if (mine.count(impl_key(param)) == 0) continue;
    const auto& name = shard.group().name();
    if (masks.count(name) == 0) order.push_back(&shard.group());
    masks[name].push_back(param.grad().defined() ? 1 : 0);
  }
  for (const auto* g : order) {
    detail::check_all_ranks_agree(*g, masks[g->name()], kWho,
                                  "the ranks differ in which tensor-parallel blocks have a gradient "
                                  "(1: has one, in declaration order); a block must have one on "
                                  "every rank of its group or on none");
  }
}

void TensorParallelOrthogonalizer::check_options(const MuonOptions& o, size_t group) const {
  check_spectral_options_need_whole_matrices(o, group, kWho, name());
  check_heads(o, group);
}

void TensorParallelOrthogonalizer::orthogonalize(std::vector<OrthogonalizeItem>& items) {
  for (auto& item : items) {
    const auto* layout = layout_of(item.param);
    if (layout == nullptr) {
      std::vector<OrthogonalizeItem> one{std::move(item)};
      local_->orthogonalize(one);  // a whole matrix on every TP rank
      item = std::move(one[0]);
      continue;
    }
    const auto& o = *item.options;
    TORCH_CHECK_VALUE(o.split_sizes().empty() && !o.stacked_experts(), kWho, "param group ",
                      item.group,
                      ": split_sizes and stacked_experts are not supported on sharded parameters");
    const auto& gs = layout->shard.global_shape();
    const int64_t dim = layout->shard.partition_dim();
    const bool blockwise = tp_.mode() == TensorParallelMode::kBlockwise;
    item.rows = blockwise ? item.update.size(0) : gs[0];
    item.cols = blockwise ? item.update.size(1) : gs[1];
    if (o.num_heads() > 1) {
      // A head block's shape: rows of one head, the block's columns in
      // blockwise mode (a row split keeps the columns whole).
      item.rows = gs[0] / o.num_heads();
      item.orth =
          detail::orthogonalize_block_heads(item.update, tp_.mode(), dim, layout->shard.group(),
                                            layout->sizes, o.ns(), o.num_heads(), gs[0]);
    } else {
      item.orth = detail::orthogonalize_block(item.update, tp_.mode(), dim, layout->shard.group(),
                                              layout->sizes, o.ns());
    }
    item.alpha = item.orth.numel() == 0
                     ? 1.0
                     : scale_factor(item.rows, item.cols, o.scale_mode(), o.extra_scale_factor());
  }
}

void TensorParallelOrthogonalizer::sum_parts(const OrthogonalizeItem& item, at::Tensor& partial,
                                             PartSum what) const {
  const auto* layout = layout_of(item.param);
  if (layout == nullptr) return;
  detail::sum_block_parts(partial, what, tp_.mode(), layout->shard.partition_dim(),
                          layout->shard.group());
}

std::shared_ptr<TensorParallelOrthogonalizer> make_orthogonalizer(TensorParallelOptions tp) {
  return std::make_shared<TensorParallelOrthogonalizer>(std::move(tp));
}

// ---- TensorParallelMuon ------------------------------------------------------------

TensorParallelMuon::TensorParallelMuon(std::vector<OptimizerParamGroup> param_groups,
                                       MuonOptions defaults, TensorParallelOptions tp)
    : TensorParallelMuon(std::move(param_groups), std::move(defaults),
                         make_orthogonalizer(std::move(tp))) {}

TensorParallelMuon::TensorParallelMuon(std::vector<at::Tensor> params, MuonOptions defaults,
                                       TensorParallelOptions tp)
    : TensorParallelMuon(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                         std::move(defaults), std::move(tp)) {}

TensorParallelMuon::TensorParallelMuon(std::vector<OptimizerParamGroup> param_groups,
                                       MuonOptions defaults,
                                       std::shared_ptr<TensorParallelOrthogonalizer> strategy)
    : Muon(std::move(param_groups), std::move(defaults), strategy), strategy_(std::move(strategy)) {}

const TensorParallelOptions& TensorParallelMuon::tp_options() const { return strategy_->options(); }

std::vector<int64_t> TensorParallelMuon::block_sizes(const at::Tensor& param) const {
  return strategy_->block_sizes(param);
}

std::string TensorParallelMuon::archive_kind() const { return "muon::distributed::TensorParallelMuon"; }

MuonFactory tensor_parallel_muon_factory(TensorParallelOptions tp) {
  return [tp = std::move(tp)](std::vector<torch::optim::OptimizerParamGroup> groups,
                              const MuonOptions& defaults) -> std::unique_ptr<Muon> {
    return std::make_unique<TensorParallelMuon>(std::move(groups), defaults, tp);
  };
}

std::pair<int64_t, int64_t> TensorParallelOrthogonalizer::max_over_processes(int64_t code) const {
  // The declared shards' groups, each once, in declaration order (the same
  // on every rank).
  std::vector<const Group*> groups;
  std::set<std::string> seen;
  for (const auto& [param, shard] : tp_.shards()) {
    if (seen.insert(shard.group().name()).second) groups.push_back(&shard.group());
  }
  return detail::max_over_groups(groups, code);
}

}  // namespace muon::distributed
