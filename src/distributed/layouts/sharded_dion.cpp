// Dion over row shards, exchanging the low-rank factors
// (muon/distributed/layouts/sharded_dion.h).
#include "muon/distributed/layouts/sharded_dion.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "distributed/layouts/dion_split.h"
#include "distributed/layouts/sharded_internal.h"
#include "muon/compat.h"
#include "util/scale.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedDion] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedDion::ShardedDion(std::vector<OptimizerParamGroup> param_groups, DionOptions defaults,
                         ShardedOptions options)
    : Dion(std::move(param_groups), std::move(defaults), /*check=*/true) {
  detail::check_owner_compute_shards(options, param_groups_, kWho, "dion", "Q", "orthonormalizes whole matrices");
  for (const auto& [param, shard] : options.shards()) groups_.emplace(param.unsafeGetTensorImpl(), shard.group());
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedDion::ShardedDion(std::vector<at::Tensor> params, std::vector<RowShard> shards, DionOptions defaults,
                         ShardedOptions options)
    : ShardedDion(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                  detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

std::pair<int64_t, int64_t> ShardedDion::whole_matrix_dims(const at::Tensor& param) const {
  return strategy_->whole_matrix_dims(param);
}

bool ShardedDion::holds_whole_state(const at::Tensor& param) const { return strategy_->owns(param); }

std::pair<int64_t, int64_t> ShardedDion::max_over_processes(int64_t code) {
  return strategy_->max_over_processes(code);
}

// One matrix's part on this rank: its rows [offset, offset + real) of the
// whole rows × cols matrix (padding rows past `rows` excluded), its group
// and the group rank of its owner.
struct ShardedDion::Part {
  Group group;
  int64_t rows, cols, offset, real, owner;
};

ShardedDion::Part ShardedDion::part_of(const at::Tensor& param, size_t flat) const {
  const auto [rows, cols] = whole_matrix_dims(param);
  const auto& per_rank = strategy_->rows_per_rank(flat);
  const auto& group = groups_.at(param.unsafeGetTensorImpl());
  int64_t offset = 0;
  for (int k = 0; k < group.rank(); ++k) offset += per_rank[static_cast<size_t>(k)];
  const auto real = std::max<int64_t>(0, std::min(rows, offset + per_rank[static_cast<size_t>(group.rank())]) - offset);
  return {group, rows, cols, std::min(offset, rows), real, strategy_->owners().at(flat)};
}

// Dion's step on one row-sharded matrix, exchanging the low-rank factors
// (the top of muon/distributed/layouts/sharded_dion.h); returns this rank's
// rows of P·Qᵀ (real rows × cols).
at::Tensor ShardedDion::matrix_update(const at::Tensor& grad, DionParamState& st, const DionOptions& o,
                                      const Part& part) {
  const auto& g = part.group;
  const bool owner = g.rank() == part.owner;
  // Q from its owner (drawn there at the first step).
  if (owner && !st.Q().defined()) st.Q(muon::detail::dion_initial_q(part.rows, part.cols, o, grad.options()));
  auto q = owner ? st.Q().contiguous() : at::empty(q_dims(part, o), grad.options());
  g.broadcast_(q, static_cast<int>(part.owner));
  st.step(st.step() + 1);
  auto m = st.momentum().view({-1, part.cols}).narrow(0, 0, part.real);
  const detail::DionSplit split{g, part.rows, part.cols, /*split_cols=*/false, part.offset, part.real};
  auto [u, q_new] = detail::dion_split_update(m, grad.narrow(0, 0, part.real), q, st.step(), o, split);
  st.Q(owner ? q_new : at::Tensor());
  return u;
}

std::vector<int64_t> ShardedDion::q_dims(const Part& part, const DionOptions& o) {
  return {std::min(part.rows, part.cols), muon::detail::dion_rank(part.rows, part.cols, o)};
}

void ShardedDion::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  auto& states = state();
  size_t flat = 0;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const DionOptions&>(group.options());
    for (auto& p : group.params()) {
      const auto index = flat++;
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<DionParamState>();
      auto& st = static_cast<DionParamState&>(*slot);
      if (!st.momentum().defined()) st.momentum(at::zeros_like(p, at::MemoryFormat::Contiguous));
      const auto part = part_of(p, index);
      const auto u = matrix_update(p.grad().reshape({p.size(0), part.cols}), st, o, part);
      muon::detail::scale_(p, 1 - o.lr() * o.weight_decay());
      p.view({-1, part.cols}).narrow(0, 0, part.real).add_(u, -o.lr() * std::sqrt(static_cast<double>(part.rows) / static_cast<double>(part.cols)));
    }
  }
}

}  // namespace muon::distributed
