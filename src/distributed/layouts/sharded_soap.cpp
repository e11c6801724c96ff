// SOAP over row shards by owner-compute: ShardedOrthogonalizer's exchange
// around SOAP's whole-matrix step (muon/distributed/layouts/sharded_soap.h).
#include "muon/distributed/layouts/sharded_soap.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "muon/compat.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedSoap] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedSoap::ShardedSoap(std::vector<OptimizerParamGroup> param_groups, SoapOptions defaults,
                         ShardedOptions options)
    : Soap(std::move(param_groups), std::move(defaults), /*check=*/true) {
  detail::check_owner_compute_shards(options, param_groups_, kWho, "soap", "SOAP state", "preconditions whole matrices");
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedSoap::ShardedSoap(std::vector<at::Tensor> params, std::vector<RowShard> shards, SoapOptions defaults,
                         ShardedOptions options)
    : ShardedSoap(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                  detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

std::pair<int64_t, int64_t> ShardedSoap::whole_matrix_dims(const at::Tensor& param) const {
  return strategy_->whole_matrix_dims(param);
}

bool ShardedSoap::holds_whole_state(const at::Tensor& param) const { return strategy_->owns(param); }

std::pair<int64_t, int64_t> ShardedSoap::max_over_processes(int64_t code) {
  return strategy_->max_over_processes(code);
}

void ShardedSoap::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  using Item = ShardedOrthogonalizer::OwnerComputeItem;
  auto& states = state();
  std::vector<Item> items;
  std::vector<const SoapOptions*> options;  // per item
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const SoapOptions&>(group.options());
    const bool l2 = o.weight_decay() != 0 && o.weight_decay_method() == SoapWeightDecay::kL2;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<SoapParamState>();
      const int64_t cols = whole_matrix_dims(p).second;
      const auto grad = p.grad().reshape({p.size(0), cols});
      // Under l2 the owner's Adam sees G + wd·p: the parameter's rows travel beside the gradient's.
      items.push_back({p, l2 ? at::cat({grad, p.detach().reshape({p.size(0), cols})}, 1) : grad, {}});
      options.push_back(&o);
    }
  }
  // At each owner: SOAP's step on the whole matrices, from the whole
  // gradient (and parameter) as one process has them.
  strategy_->owner_compute(items, [&](const std::vector<const Item*>& mine, const std::vector<at::Tensor>& wholes) {
    std::vector<at::Tensor> updates;
    for (const auto k : c10::irange(mine.size())) {
      const auto& o = *options[static_cast<size_t>(mine[k] - items.data())];
      auto& st = static_cast<SoapParamState&>(*states.at(compat::state_key(mine[k]->param)));
      const int64_t cols = whole_matrix_dims(mine[k]->param).second;
      const auto grad = wholes[k].narrow(1, 0, cols).contiguous();
      auto adam_grad = grad;
      if (wholes[k].size(1) > cols) adam_grad = grad.add(wholes[k].narrow(1, cols, cols).contiguous(), o.weight_decay());
      updates.push_back(muon::detail::soap_matrix_update(grad, adam_grad, st, o, /*one_d=*/false));
    }
    return updates;
  });
  // Every rank: its rows of the update, after weight decay on its rows, as one process.
  for (const auto k : c10::irange(items.size())) {
    auto& p = items[k].param;
    const auto& o = *options[k];
    auto& st = static_cast<SoapParamState&>(*states.at(compat::state_key(p)));
    if (!holds_whole_state(p)) st.step(st.step() + 1);  // the owner's step counted it
    if (o.weight_decay() != 0 && o.weight_decay_method() != SoapWeightDecay::kL2) {
      const double rate =
          o.weight_decay_method() == SoapWeightDecay::kDecoupled ? o.lr() * o.weight_decay() : o.weight_decay();
      p.add_(p, -rate);
    }
    p.add_(items[k].result.view(p.sizes()), -o.lr());
  }
}

}  // namespace muon::distributed
