// One face for every layout: build from a config, one agreement per step,
// reduction, the optimizer, gathering.
#include "muon/distributed/layouts/layout.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <utility>

#include "distributed/layouts/row_shards.h"
#include "distributed/layouts/step_agreement.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/runtime/agreement.h"
#include "muon/optim/state_bytes.h"
#include "muon/optim/step_guard.h"
#include "muon/qk_clip.h"
#include "util/names.h"

namespace muon::distributed {
namespace {

constexpr const char* kWho = "[muon::distributed::Layout] ";
// Bytes per bucket of each reduction when LayoutGroups::bucket_bytes is 0.
constexpr int64_t kAllReduceBucketBytes = int64_t{32} << 20;
constexpr int64_t kReduceScatterBucketBytes = int64_t{4} << 20;

bool same_group(const Group& a, const Group& b) {
  return a.name() == b.name() && a.world_ranks() == b.world_ranks();
}

// "parameter '<name>'", one per parameter: every rank of the layout holds
// the same names in the same order (the shapes of TP blocks and shards differ).
std::vector<AgreementItem> name_items(const torch::OrderedDict<std::string, at::Tensor>& params) {
  std::vector<AgreementItem> out;
  out.push_back({"number of parameters", std::to_string(params.size())});
  for (const auto i : c10::irange(params.size())) {
    out.push_back({c10::str("name of parameter ", i), params[i].key()});
  }
  return out;
}

}  // namespace

std::string to_string(GradientReduction reduction) {
  switch (reduction) {
    case GradientReduction::kNone: return "none";
    case GradientReduction::kAllReduce: return "all_reduce";
    case GradientReduction::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

Layout::Layout(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
               const OptimizerConfig& config, LayoutGroups groups, const OptimizerRegistry& registry) {
  build(&named_parameters, nullptr, config, std::move(groups), registry);
}

Layout::Layout(const std::vector<GroupSpec>& groups, const OptimizerConfig& config,
               LayoutGroups layout_groups, const OptimizerRegistry& registry) {
  build(nullptr, &groups, config, std::move(layout_groups), registry);
}

Layout::Layout(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
               std::unique_ptr<torch::optim::Optimizer> optimizer, LayoutGroups groups,
               DistributedLayout checkpoint_layout) {
  TORCH_CHECK_VALUE(optimizer != nullptr, kWho, "optimizer is null");
  TORCH_CHECK_VALUE(groups.row_shards().empty() && groups.tensor_parallel().empty(), kWho,
                    "an optimizer built elsewhere is laid out replicated (layout none): give "
                    "neither row_shards nor tensor_parallel");
  set_groups(groups);
  params_ = named_parameters;
  checkpoint_layout_ = std::move(checkpoint_layout);
  optimizer_ = std::move(optimizer);
  reduction_ = dp_.size() > 1 && !groups.gradients_reduced() ? GradientReduction::kAllReduce
                                                              : GradientReduction::kNone;
  bucket_bytes_ = groups.bucket_bytes() > 0 ? groups.bucket_bytes() : kAllReduceBucketBytes;
  check_ranks_agree(world_, name_items(params_), kWho, "every rank must pass the same parameter names");
  if (auto* guard = muon::step_guard(*optimizer_)) guard->set_agreed_by_layout(true);
}

Layout::~Layout() = default;
Layout::Layout(Layout&&) noexcept = default;
Layout& Layout::operator=(Layout&&) noexcept = default;

void Layout::set_groups(LayoutGroups& groups) {
  world_ = groups.world().valid() ? groups.world()
           : groups.dp().valid()  ? groups.dp()
                                  : Group::single();
  dp_ = groups.dp().valid() ? groups.dp() : world_;
  // Without a group spanning every rank, the step's agreement runs over dp
  // and each group the shards name (tensor-parallel, row-shard groups).
  peers_.clear();
  if (!groups.world().valid()) {
    std::vector<Group> distinct{dp_};
    auto add = [&](const Group& g) {
      const bool seen = std::any_of(distinct.begin(), distinct.end(),
                                    [&](const Group& s) { return same_group(s, g); });
      if (!seen) distinct.push_back(g);
    };
    for (const auto& entry : groups.tensor_parallel()) add(entry.second.group());
    for (const auto& entry : groups.row_shards()) {
      add(entry.second.group());
      if (entry.second.has_tensor_parallel()) add(entry.second.tp().group());
    }
    if (distinct.size() > 1) peers_ = std::move(distinct);
  }
}

void Layout::build(const torch::OrderedDict<std::string, at::Tensor>* named_parameters,
                   const std::vector<GroupSpec>* groups, const OptimizerConfig& config,
                   LayoutGroups layout_groups, const OptimizerRegistry& registry) {
  set_groups(layout_groups);
  kind_ = config.get_string("layout");
  const bool fsdp = !layout_groups.row_shards().empty();
  TORCH_CHECK_VALUE(!fsdp || kind_ == "sharded", kWho, "row_shards are given but config field "
                    "'layout' is '", muon::detail::clip(kind_, 40), "'; row shards are the sharded layout");
  TORCH_CHECK_VALUE(layout_groups.tensor_parallel().empty() || kind_ == "tensor_parallel" ||
                        kind_ == "sharded",
                    kWho, "tensor_parallel blocks are given but config field 'layout' is '",
                    muon::detail::clip(kind_, 40), "'; use tensor_parallel, or sharded for 2-D");
  if (groups != nullptr) {
    for (const auto& g : *groups) {
      for (const auto i : c10::irange(g.params.size())) params_.insert(g.names.at(i), g.params[i]);
    }
  } else {
    params_ = *named_parameters;
  }
  const bool data_parallel = dp_.size() > 1 && !layout_groups.gradients_reduced();
  DistributedLayout dl;
  dl.group = kind_ == "layerwise" ? dp_ : world_;
  dl.tensor_parallel = layout_groups.tensor_parallel();
  dl.row_shards = layout_groups.row_shards();
  if (kind_ == "sharded" && !fsdp) {
    TORCH_CHECK_VALUE(groups == nullptr, kWho, "the sharded layout makes row shards of named "
                      "parameters: build it from named parameters, or give row_shards");
    bucket_bytes_ = layout_groups.bucket_bytes() > 0 ? layout_groups.bucket_bytes() : kReduceScatterBucketBytes;
    rows_ = std::make_unique<detail::RowShards>(params_, dp_, layout_groups.tensor_parallel(),
                                                layout_groups.tp_mode(), bucket_bytes_, kWho);
    dl = rows_->layout();
    // At one rank too: the reduce-scatter copies the gradients into the rows.
    reduction_ = GradientReduction::kReduceScatter;
    optimizer_ = make_optimizer(rows_->shards(), config, dl, registry);
  } else {
    bucket_bytes_ = layout_groups.bucket_bytes() > 0 ? layout_groups.bucket_bytes() : kAllReduceBucketBytes;
    reduction_ = data_parallel && !fsdp ? GradientReduction::kAllReduce : GradientReduction::kNone;
    if (groups != nullptr) {
      auto built = make_grouped_optimizer(*groups, config, dl, registry);
      optimizer_ = std::move(built.optimizer);
      group_index_ = std::move(built.group_index);
    } else {
      optimizer_ = make_optimizer(params_, config, dl, registry);
    }
  }
  checkpoint_layout_ = std::move(dl);
  const auto& agreement = peers_.empty() ? world_ : dp_;
  check_ranks_agree(agreement, name_items(params_), kWho, "every rank must pass the same parameter names");
  if (auto* guard = muon::step_guard(*optimizer_)) guard->set_agreed_by_layout(true);
}

torch::optim::Optimizer& Layout::optimizer() { return *optimizer_; }
const torch::optim::Optimizer& Layout::optimizer() const { return *optimizer_; }

const detail::RowShards& Layout::rows() const {
  TORCH_CHECK(rows_ != nullptr, kWho, "the layout has no row shards of its own");
  return *rows_;
}

std::string Layout::describe() const {
  const auto w = std::to_string(world_.size());
  if (world_.size() == 1) return "single process";
  if (kind_ == "layerwise") return "layer-wise " + w;
  if (kind_ == "tensor_parallel") {
    return dp_.size() > 1 ? c10::str("tensor parallel ", world_.size() / dp_.size(), " x data parallel ", dp_.size())
                          : "tensor parallel " + w;
  }
  if (kind_ == "sharded") {
    if (!checkpoint_layout_.tensor_parallel.empty() ||
        std::any_of(checkpoint_layout_.row_shards.begin(), checkpoint_layout_.row_shards.end(),
                    [](const auto& e) { return e.second.has_tensor_parallel(); })) {
      return c10::str("2-D ", dp_.size(), " x ", world_.size() / std::max(dp_.size(), 1));
    }
    return rows_ ? "sharded " + w : "sharded (FSDP) " + w;
  }
  return "replicated " + w;
}

const torch::OrderedDict<std::string, at::Tensor>& Layout::checkpoint_parameters() const {
  return rows_ ? rows_->shards() : params_;
}

const DistributedLayout& Layout::checkpoint_layout() const { return checkpoint_layout_; }

void Layout::parameters_loaded() {
  if (rows_) rows_->all_gather(std::vector<bool>(params_.size(), true));
}

int64_t Layout::extra_parameter_bytes() const { return rows_ ? rows_->shard_bytes() : 0; }

int64_t Layout::state_bytes() const { return muon::optimizer_state_bytes(*optimizer_); }

void Layout::zero_grad() {
  for (auto& item : params_) item.value().mutable_grad() = at::Tensor();
  if (rows_) rows_->clear_shard_grads();
  // An optimizer built elsewhere may hold gradients of tensors of its own.
  if (!rows_) optimizer_->zero_grad();
}

void Layout::reduce_gradients() {
  if (reduced_) return;
  at::NoGradGuard no_grad;
  if (rows_) rows_->clear_shard_grads();
  std::vector<const Group*> peers;
  for (const auto& g : peers_) peers.push_back(&g);
  const auto& group = peers_.empty() ? world_ : dp_;
  try {
    const int64_t summed = reduction_ == GradientReduction::kNone ? 1 : dp_.size();
    const auto verdict =
        detail::agree_step(group, peers, {&params_, optimizer_.get(), summed, kind_ != "layerwise", who_.c_str()});
    active_ = verdict.active;
    skip_ = verdict.skip;
    if (!skip_ && reduction_ == GradientReduction::kAllReduce) {
      std::vector<at::Tensor> reduced;
      for (const auto i : c10::irange(params_.size())) {
        if (active_[i]) reduced.push_back(params_[i].value());
      }
      all_reduce_gradients(reduced, dp_, bucket_bytes_);
    } else if (!skip_ && reduction_ == GradientReduction::kReduceScatter) {
      rows_->reduce_scatter(active_);
    }
    if (!skip_ && verdict.recheck) {
      skip_ = detail::agree_reduced_finite(group, peers, rows_ ? rows_->shards() : params_,
                                           *optimizer_, who_.c_str());
    }
  } catch (...) {
    if (rows_) rows_->clear_shard_grads();
    throw;
  }
  reduced_ = true;
}

void Layout::scale_rows(const std::string& name, const at::Tensor& factors) {
  const auto* param = params_.find(name);
  TORCH_CHECK_VALUE(param != nullptr, who_, "scale_rows: no parameter named '",
                    muon::detail::clip(name), "'");
  TORCH_CHECK_VALUE(factors.defined() && factors.dim() == 1 && factors.numel() == param->size(0),
                    who_, "scale_rows: factors of '", muon::detail::clip(name),
                    "' must be 1-D with one element per row (", param->size(0), ")");
  TORCH_CHECK_VALUE(at::isfinite(factors).all().item<bool>(), who_, "scale_rows: factors of '",
                    muon::detail::clip(name), "' must be finite");
  if (rows_) {
    // This rank's master rows of the parameter (of its tensor-parallel block in 2-D).
    auto shard = rows_->shards()[name];
    muon::scale_rows_(shard, factors.narrow(0, rows_->row_offset(name), shard.size(0)));
  }
  auto p = *param;
  muon::scale_rows_(p, factors);
}

void Layout::step() {
  reduce_gradients();
  reduced_ = false;
  if (skip_) {
    if (rows_) rows_->clear_shard_grads();
    ++skipped_;
    return;
  }
  optimizer_->step();
  if (rows_) rows_->all_gather(active_);
}

}  // namespace muon::distributed
