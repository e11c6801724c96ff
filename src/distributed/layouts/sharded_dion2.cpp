// Dion2 over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around Dion2's whole-parameter step (muon/distributed/layouts/sharded_dion2.h).
#include "muon/distributed/layouts/sharded_dion2.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "distributed/layouts/sharded_internal.h"
#include "muon/compat.h"
#include "util/scale.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedDion2] ";

using torch::optim::OptimizerParamGroup;

// What owner-compute Dion2 cannot step, refused before any collective: the
// replicated mode, parameters of fewer than 2 dims and tensor-parallel blocks.
void check_shards(const ShardedOptions& options, const char* algorithm) {
  TORCH_CHECK_VALUE(options.mode() == ShardedMode::kOwnerCompute, kWho, "optimizer '", algorithm,
                    "' runs in the sharded layout in mode owner_compute only, got '",
                    to_string(options.mode()), "' (each matrix's state lives with one owner)");
  for (const auto& [param, shard] : options.shards()) {
    (void)param;
    TORCH_CHECK_VALUE(shard.global_shape().size() >= 2, kWho, "a parameter has global shape ",
                      c10::IntArrayRef(shard.global_shape()), "; optimizer '", algorithm,
                      "' steps matrices (give 1-D parameters to the scalar optimizer)");
    TORCH_CHECK_VALUE(!shard.has_tensor_parallel(), kWho,
                      "a parameter is a tensor-parallel block (the 2-D layout); optimizer '",
                      algorithm, "' selects over whole matrices and does not run on them");
  }
}

}  // namespace

ShardedDion2::ShardedDion2(std::vector<OptimizerParamGroup> param_groups, Dion2Options defaults,
                           ShardedOptions options)
    : Dion2(std::move(param_groups), std::move(defaults), /*check=*/true) {
  check_shards(options, static_cast<const Dion2Options&>(this->defaults()).algorithm());
  for (const auto& [param, shard] : options.shards()) {
    global_shapes_[param.unsafeGetTensorImpl()] = shard.global_shape();
    groups_.emplace(param.unsafeGetTensorImpl(), shard.group());
  }
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedDion2::ShardedDion2(std::vector<at::Tensor> params, std::vector<RowShard> shards,
                           Dion2Options defaults, ShardedOptions options)
    : ShardedDion2(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)},
                   std::move(defaults),
                   detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

std::vector<int64_t> ShardedDion2::whole_shape(const at::Tensor& param) const {
  const auto it = global_shapes_.find(param.unsafeGetTensorImpl());
  TORCH_CHECK_VALUE(it != global_shapes_.end(), kWho, "a parameter of shape ", param.sizes(),
                    " was not given to this optimizer");
  return it->second;
}

std::pair<int64_t, int64_t> ShardedDion2::max_over_processes(int64_t code) {
  return strategy_->max_over_processes(code);
}

namespace {

// Rows the ranks hold of a matrix of `rows` rows: each rank's first global
// row and its real rows (padding rows past the end excluded).
struct RowSplit {
  std::vector<int64_t> offset, real;
};

RowSplit split_of(const std::vector<int64_t>& rows_per_rank, int64_t rows) {
  RowSplit out;
  int64_t at = 0;
  for (const auto n : rows_per_rank) {
    out.offset.push_back(at);
    out.real.push_back(std::clamp<int64_t>(rows - at, 0, n));
    at += n;
  }
  return out;
}

// The block each rank receives from `owner`'s one-to-all or sends in an
// all-to-one: counts of `width` elements per row.
std::vector<int64_t> at_rank(int size, int64_t rank, int64_t count) {
  std::vector<int64_t> out(static_cast<size_t>(size), 0);
  out[static_cast<size_t>(rank)] = count;
  return out;
}

// One split matrix's step on this rank (ShardedDion2::step_split_matrix): its
// group and owner, its shape, this rank's rows (local, padding included; mine,
// real), the matrix's largest |M| (max_t), and this rank's rows of M (mv) and
// of U (update_rows).
struct SplitStep {
  const Group& group;
  int size, me;
  int64_t owner, rows, cols, local, mine;
  const RowSplit& split;
  at::Tensor mv, max_t, update_rows;
};

// Rows selected (rows <= cols, or NorDion2): `width` elements per selected
// row travel (with NorDion2's variance).
void step_by_rows(const SplitStep& s, const at::Tensor& p, Dion2ParamState& st, const Dion2Options& o,
                  int64_t width) {
  const auto& group = s.group;
  const int size = s.size, me = s.me;
  const int64_t owner = s.owner, rows = s.rows, cols = s.cols, local = s.local, mine = s.mine;
  const auto& split = s.split;
  const auto &mv = s.mv, &max_t = s.max_t, &update_rows = s.update_rows;
  // Row norms are each rank's own; every rank selects from all of them.
  const auto local_norms =
      muon::detail::dion2_fixed_point_norms(mv.unsqueeze(0), max_t, true).view({-1});
  const auto norms = at::cat(group.all_gather_uneven(local_norms)).view({1, rows});
  const int64_t k = muon::detail::dion2_k(o.fraction(), rows);
  const auto idx = muon::detail::dion2_top_k(norms, k).view({-1});
  std::vector<int64_t> count(static_cast<size_t>(size), 0);
  std::vector<int64_t> here;
  const auto idx_cpu = idx.cpu();
  const auto* ip = idx_cpu.data_ptr<int64_t>();
  for (int64_t j = 0; j < k; ++j) {
    for (int r = 0; r < size; ++r) {
      const auto ru = static_cast<size_t>(r);
      if (ip[j] >= split.offset[ru] && ip[j] < split.offset[ru] + split.real[ru]) {
        ++count[ru];
        if (r == me) here.push_back(ip[j] - split.offset[ru]);
      }
    }
  }
  const auto loc = at::tensor(here, at::kLong).to(p.device());
  const auto selected = mv.index_select(0, loc);
  mv.index_copy_(0, loc, selected * o.ef_decay());
  at::Tensor v_rows;
  auto send = selected;
  if (o.nordion2()) {
    v_rows = st.variance().view({local, 1}).narrow(0, 0, mine);
    send = at::cat({selected, v_rows.index_select(0, loc)}, 1);
  }
  // The selected rows (and their variance) to the owner.
  std::vector<int64_t> recv_counts(static_cast<size_t>(size), 0);
  if (me == owner) {
    for (int r = 0; r < size; ++r)
      recv_counts[static_cast<size_t>(r)] = count[static_cast<size_t>(r)] * width;
  }
  const auto gathered = group
                            .all_to_all_async(send.contiguous().view({-1}),
                                              at_rank(size, owner, send.numel()), recv_counts)
                            .wait()
                            .at(0);
  // The owner: Newton–Schulz (and the normalization) of the k × cols submatrix as one process.
  auto back = at::empty({0}, p.options());
  if (me == owner) {
    const auto whole = gathered.view({k, width});
    const auto sub = whole.narrow(1, 0, cols).contiguous().view({1, k, cols});
    if (o.nordion2()) {
      auto v_sel = whole.narrow(1, cols, 1).contiguous().view({1, k, 1});
      const auto orth = muon::detail::dion2_orthogonalize(sub, &v_sel, o);
      back = at::cat({orth.view({k, cols}), v_sel.view({k, 1}).to(orth.scalar_type())}, 1);
    } else {
      back = muon::detail::dion2_orthogonalize(sub, nullptr, o).view({k, cols});
    }
  }
  std::vector<int64_t> send_back(static_cast<size_t>(size), 0);
  if (me == owner) {
    for (int r = 0; r < size; ++r)
      send_back[static_cast<size_t>(r)] = count[static_cast<size_t>(r)] * width;
  }
  const auto got =
      group
          .all_to_all_async(back.contiguous().view({-1}), send_back,
                            at_rank(size, owner, static_cast<int64_t>(here.size()) * width))
          .wait()
          .at(0)
          .view({static_cast<int64_t>(here.size()), width});
  if (o.nordion2()) v_rows.index_copy_(0, loc, got.narrow(1, cols, 1).to(v_rows.scalar_type()));
  update_rows.index_copy_(0, loc, got.narrow(1, 0, cols));
}

// Columns selected (rows > cols, Dion2): each rank's rows of the selected columns travel.
void step_by_columns(const SplitStep& s, const at::Tensor& p, const Dion2Options& o) {
  const auto& group = s.group;
  const int size = s.size, me = s.me;
  const int64_t owner = s.owner, rows = s.rows, cols = s.cols, mine = s.mine;
  const auto& split = s.split;
  const auto &mv = s.mv, &max_t = s.max_t, &update_rows = s.update_rows;
  // Column norms: each rank's exact partial sums over its rows, added up.
  auto norms = muon::detail::dion2_fixed_point_norms(mv.unsqueeze(0), max_t, false).view({-1});
  const auto parts = group.all_gather(norms);
  norms = at::zeros_like(norms);
  for (const auto& part : parts) norms.add_(part);
  const int64_t k = muon::detail::dion2_k(o.fraction(), cols);
  const auto idx = muon::detail::dion2_top_k(norms.view({1, cols}), k).view({-1});
  const auto selected = mv.index_select(1, idx);  // mine × k
  mv.index_copy_(1, idx, selected * o.ef_decay());
  std::vector<int64_t> per_rank(static_cast<size_t>(size), 0);
  if (me == owner) {
    for (int r = 0; r < size; ++r)
      per_rank[static_cast<size_t>(r)] = split.real[static_cast<size_t>(r)] * k;
  }
  const auto gathered = group
                            .all_to_all_async(selected.contiguous().view({-1}),
                                              at_rank(size, owner, mine * k), per_rank)
                            .wait()
                            .at(0);
  auto back = at::empty({0}, p.options());
  if (me == owner) {
    back = muon::detail::dion2_orthogonalize(gathered.view({1, rows, k}), nullptr, o)
               .view({rows, k});
  }
  const auto got = group
                       .all_to_all_async(back.contiguous().view({-1}), per_rank,
                                         at_rank(size, owner, mine * k))
                       .wait()
                       .at(0)
                       .view({mine, k});
  update_rows.index_copy_(1, idx, got);
}

}  // namespace

at::Tensor ShardedDion2::step_split_matrix(const at::Tensor& p, Dion2ParamState& st,
                                           const Dion2Options& o, size_t index) {
  const auto shape = whole_shape(p);
  const auto& group = groups_.at(p.unsafeGetTensorImpl());
  const int size = group.size();
  const int me = group.rank();
  const int64_t owner = strategy_->owners().at(index);
  const int64_t rows = shape[0];
  const int64_t cols = c10::multiply_integers(shape.begin() + 1, shape.end());
  const auto split = split_of(strategy_->rows_per_rank(index), rows);
  const int64_t mine = split.real[static_cast<size_t>(me)];
  const int64_t local = p.size(0);

  if (!st.momentum().defined()) st.momentum(at::zeros_like(p, at::MemoryFormat::Contiguous));
  if (o.nordion2() && !st.variance().defined()) {
    st.variance(at::zeros(muon::detail::dion2_variance_shape(p.sizes(), o.flatten()), p.options()));
  }
  st.step(st.step() + 1);
  auto& m = st.momentum();
  m.add_(p.grad().to(m.scalar_type()));
  auto mv = m.view({local, cols}).narrow(0, 0, mine);

  // The matrix's largest |M| (a max: the same in any order), then the norms.
  const double local_max = mine > 0 ? mv.abs().max().item<double>() : 0.0;
  double max = 0;
  for (const auto& t :
       group.all_gather(at::tensor({local_max}, at::kDouble).to(group.device())))
    max = std::max(max, t.item<double>());
  const auto max_t = at::tensor({max}, at::kDouble);
  const bool by_rows = o.nordion2() || rows <= cols;
  const int64_t width = by_rows ? cols + (o.nordion2() ? 1 : 0) : 0;
  auto update = at::zeros({local, cols}, p.options());
  auto update_rows = update.narrow(0, 0, mine);

  const SplitStep step{group, size, me, owner, rows, cols, local, mine, split, mv, max_t, update_rows};
  if (by_rows) {
    step_by_rows(step, p, st, o, width);
  } else {
    step_by_columns(step, p, o);
  }
  return update.view(p.sizes());
}

void ShardedDion2::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  auto& states = state();
  size_t index = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const Dion2Options&>(group.options());
    for (auto& p : group.params()) {
      const size_t i = index++;
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<Dion2ParamState>();
      auto& st = static_cast<Dion2ParamState&>(*slot);
      const auto shape = whole_shape(p);
      // Stacked matrices (no flatten, 3+ dims): the rows split whole
      // matrices, each rank steps its own as one process; else the exchange.
      const auto u = !o.flatten() && shape.size() >= 3 ? muon::detail::dion2_update(p.grad(), st, o)
                                                       : step_split_matrix(p, st, o, i);
      muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
      p.add_(u, -muon::detail::dion2_adjusted_lr(shape, o));
    }
  }
}

}  // namespace muon::distributed
