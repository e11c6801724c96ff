// The KL-SOAP family over row shards by owner-compute: ShardedOrthogonalizer's
// exchange around the family's whole-parameter step
// (muon/distributed/layouts/sharded_kl_soap.h).
#include "muon/distributed/layouts/sharded_kl_soap.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <utility>

#include "distributed/layouts/sharded_internal.h"
#include "muon/compat.h"
#include "optim/elementwise_optimizer.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::ShardedKlSoap] ";

using torch::optim::OptimizerParamGroup;

}  // namespace

ShardedKlSoap::ShardedKlSoap(std::vector<OptimizerParamGroup> param_groups, KlSoapOptions defaults,
                             ShardedOptions options)
    : KlSoap(std::move(param_groups), std::move(defaults), /*check=*/true) {
  detail::check_owner_compute_shards(options, param_groups_, kWho,
                                     static_cast<const KlSoapOptions&>(this->defaults()).kind().c_str(), "KL-SOAP state",
                                     "preconditions whole matrices");
  strategy_ = make_orthogonalizer(std::move(options));
  strategy_->attach(param_groups_);
}

ShardedKlSoap::ShardedKlSoap(std::vector<at::Tensor> params, std::vector<RowShard> shards,
                             KlSoapOptions defaults, ShardedOptions options)
    : ShardedKlSoap(std::vector<OptimizerParamGroup>{OptimizerParamGroup(params)}, std::move(defaults),
                    detail::with_shards(kWho, std::move(options), params, std::move(shards))) {}

std::pair<int64_t, int64_t> ShardedKlSoap::whole_matrix_dims(const at::Tensor& param) const {
  return strategy_->whole_matrix_dims(param);
}

bool ShardedKlSoap::holds_whole_state(const at::Tensor& param) const { return strategy_->owns(param); }

std::pair<int64_t, int64_t> ShardedKlSoap::max_over_processes(int64_t code) {
  return strategy_->max_over_processes(code);
}

void ShardedKlSoap::step_parameters() {
  if (!agreed_by_layout()) strategy_->begin_step(param_groups_);
  using Item = ShardedOrthogonalizer::OwnerComputeItem;
  auto& states = state();
  std::vector<Item> items;
  std::vector<const KlSoapOptions*> options;  // per item
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const KlSoapOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[compat::state_key(p)];
      if (!slot) slot = std::make_unique<KlSoapParamState>();
      const int64_t cols = whole_matrix_dims(p).second;
      const auto grad = p.grad().reshape({p.size(0), cols});
      // Under l2 the owner's inner step sees G + wd·p: the parameter's rows travel beside the gradient's.
      const bool l2 = o.weight_decay() != 0 && o.weight_decay_method() == "l2";
      items.push_back({p, l2 ? at::cat({grad, p.detach().reshape({p.size(0), cols})}, 1) : grad, {}});
      options.push_back(&o);
    }
  }
  // At each owner: the family's step on the whole gradients (and parameters), as one process has them.
  strategy_->owner_compute(items, [&](const std::vector<const Item*>& mine, const std::vector<at::Tensor>& wholes) {
    std::vector<at::Tensor> updates;
    for (const auto k : c10::irange(mine.size())) {
      const auto& o = *options[static_cast<size_t>(mine[k] - items.data())];
      auto& st = static_cast<KlSoapParamState&>(*states.at(compat::state_key(mine[k]->param)));
      const auto& p = mine[k]->param;
      const int64_t cols = whole_matrix_dims(p).second;
      const auto grad = wholes[k].narrow(1, 0, cols).contiguous();
      auto inner = grad;
      if (wholes[k].size(1) > cols) inner = grad.add(wholes[k].narrow(1, cols, cols).contiguous(), o.weight_decay());
      updates.push_back(muon::detail::kl_soap_update(grad, inner, p.sizes().slice(1), st, o));
    }
    return updates;
  });
  // Every rank: weight decay and its rows of the update, as one process.
  for (const auto k : c10::irange(items.size())) {
    auto& p = items[k].param;
    const auto& o = *options[k];
    auto& st = static_cast<KlSoapParamState&>(*states.at(compat::state_key(p)));
    if (!holds_whole_state(p)) st.step(st.step() + 1);  // the owner's step counted it
    if (o.weight_decay_method() != "l2") {  // l2 entered the owner's inner step
      muon::detail::apply_weight_decay(p, p.grad(), o.weight_decay_method(), o.lr(), o.weight_decay());
    }
    p.detach().add_(items[k].result.view(p.sizes()), -o.lr());
  }
}

}  // namespace muon::distributed
