// Muon + AdamW as one optimizer over named parameters.
#include "muon/optim/hybrid.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <unordered_map>

#include "muon/compat.h"

namespace muon {
namespace {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::MuonWithAdamW] ";

// One param group under construction.
struct PendingGroup {
  std::string pattern;  // empty: the default group of its side
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<size_t> decisions;  // indices into routing_
};

template <typename Options>
int first_pattern(const std::vector<std::pair<std::string, Options>>& groups,
                  const std::string& name) {
  for (size_t i = 0; i < groups.size(); ++i) {
    if (glob_match(groups[i].first, name)) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

torch::optim::AdamWOptions default_aux_adamw_options() {
  return AdamWOptions(3e-4).betas(std::make_tuple(0.9, 0.95)).eps(1e-8).weight_decay(0.0);
}

MuonWithAdamWOptions& MuonWithAdamWOptions::muon_group(const std::string& pattern,
                                                       MuonOptions options) {
  TORCH_CHECK_VALUE(!pattern.empty(), kWho, "muon_group pattern must not be empty");
  muon_groups_.emplace_back(pattern, std::move(options));
  return *this;
}

MuonWithAdamWOptions& MuonWithAdamWOptions::adamw_group(const std::string& pattern,
                                                        torch::optim::AdamWOptions options) {
  TORCH_CHECK_VALUE(!pattern.empty(), kWho, "adamw_group pattern must not be empty");
  adamw_groups_.emplace_back(pattern, std::move(options));
  return *this;
}

MuonWithAdamW::MuonWithAdamW(const torch::OrderedDict<std::string, at::Tensor>& named_parameters,
                             MuonWithAdamWOptions options)
    : Optimizer(std::vector<OptimizerParamGroup>{},
                std::make_unique<MuonOptions>(options.muon())) {
  options.muon().validate();  // even when no parameter goes to Muon: a typo is a typo
  for (const auto& g : options.muon_groups()) g.second.validate();
  routing_ = route_parameters(named_parameters, options.routing());

  // Default group of each side first, then its pattern groups.
  std::vector<PendingGroup> muon_side(1 + options.muon_groups().size());
  std::vector<PendingGroup> adamw_side(1 + options.adamw_groups().size());
  for (size_t i = 0; i < options.muon_groups().size(); ++i) {
    muon_side[i + 1].pattern = options.muon_groups()[i].first;
  }
  for (size_t i = 0; i < options.adamw_groups().size(); ++i) {
    adamw_side[i + 1].pattern = options.adamw_groups()[i].first;
  }
  // A tensor registered under two names (tied weights) is optimized once,
  // with the decision of its first name.
  std::unordered_map<const c10::TensorImpl*, size_t> first_name;
  std::vector<std::pair<size_t, size_t>> aliases;  // (decision, decision of first name)
  size_t index = 0;
  for (const auto& item : named_parameters) {
    auto& d = routing_[index];
    const auto [seen, fresh] = first_name.emplace(item.value().unsafeGetTensorImpl(), index);
    if (!fresh) {
      const auto& first = routing_[seen->second];
      d.route = first.route;
      d.reason = "same tensor as '" + first.name + "'";
      aliases.emplace_back(index, seen->second);
      ++index;
      continue;
    }
    const bool to_muon = d.route == Route::kMuon;
    const int k = to_muon ? first_pattern(options.muon_groups(), d.name)
                          : first_pattern(options.adamw_groups(), d.name);
    auto& g = (to_muon ? muon_side : adamw_side)[static_cast<size_t>(k + 1)];
    g.params.push_back(item.value());
    g.names.push_back(d.name);
    g.decisions.push_back(index);
    ++index;
  }
  for (const auto* side : {&muon_side, &adamw_side}) {
    for (const auto& g : *side) {
      TORCH_CHECK_VALUE(g.pattern.empty() || !g.params.empty(), kWho, "the ",
                        side == &muon_side ? "muon_group" : "adamw_group", " pattern '", g.pattern,
                        "' matches no parameter routed to ",
                        side == &muon_side ? "Muon" : "AdamW", "; routing:\n",
                        format_routing(routing_));
    }
  }

  // Build the groups: Muon's, then AdamW's, leaving out empty ones.
  std::vector<OptimizerParamGroup> muon_groups;
  std::vector<OptimizerParamGroup> adamw_groups;
  for (size_t i = 0; i < muon_side.size(); ++i) {
    auto& g = muon_side[i];
    if (g.params.empty()) continue;
    const auto& o = i == 0 ? options.muon() : options.muon_groups()[i - 1].second;
    for (const auto d : g.decisions) routing_[d].group = static_cast<int64_t>(muon_groups.size());
    muon_groups.emplace_back(g.params, std::make_unique<MuonOptions>(o));
    group_names_.push_back(g.names);
  }
  num_muon_groups_ = muon_groups.size();
  for (size_t i = 0; i < adamw_side.size(); ++i) {
    auto& g = adamw_side[i];
    if (g.params.empty()) continue;
    const auto& o = i == 0 ? options.adamw() : options.adamw_groups()[i - 1].second;
    for (const auto d : g.decisions) {
      routing_[d].group = static_cast<int64_t>(num_muon_groups_ + adamw_groups.size());
    }
    adamw_groups.emplace_back(g.params, std::make_unique<AdamWOptions>(o));
    group_names_.push_back(g.names);
  }
  for (const auto& [alias, first] : aliases) routing_[alias].group = routing_[first].group;

  // The inner optimizers validate their options and parameters.
  if (!muon_groups.empty()) {
    if (options.muon_factory()) {
      muon_ = options.muon_factory()(muon_groups, options.muon());
      TORCH_CHECK_VALUE(muon_ != nullptr, kWho, "muon_factory returned a null optimizer");
    } else {
      muon_ = std::make_unique<Muon>(muon_groups, options.muon());
    }
  }
  if (!adamw_groups.empty()) {
    adamw_ = std::make_unique<AdamW>(adamw_groups, options.adamw());
    compat::reapply_group_options(*adamw_, adamw_groups);
  }
  for (const auto& g : muon_groups) add_param_group(g);
  for (const auto& g : adamw_groups) add_param_group(g);
  std::vector<OptimizerParamGroup> all = muon_groups;
  for (const auto& g : adamw_groups) all.push_back(g);
  compat::reapply_group_options(*this, all);
}

bool MuonWithAdamW::is_muon_group(size_t index) const {
  TORCH_CHECK_VALUE(index < param_groups_.size(), kWho, "group index ", index,
                    " out of range for ", param_groups_.size(), " groups");
  return index < num_muon_groups_;
}

std::string MuonWithAdamW::routing_table() const { return format_routing(routing_); }

void MuonWithAdamW::sync_options() {
  TORCH_CHECK_VALUE(param_groups_.size() == group_names_.size(), kWho, "has ",
                    param_groups_.size(), " param groups but was built with ", group_names_.size(),
                    "; groups cannot be added after construction");
  for (const auto i : c10::irange(param_groups_.size())) {
    const auto& group = param_groups_[i];
    const bool is_muon = i < num_muon_groups_;
    auto& inner = is_muon ? muon_->param_groups()[i] : adamw_->param_groups()[i - num_muon_groups_];
    TORCH_CHECK_VALUE(group.params().size() == inner.params().size(), kWho, "param group ", i,
                      " has ", group.params().size(), " parameters but was built with ",
                      inner.params().size(), "; parameters cannot be added after construction");
    const bool right_type = is_muon ? dynamic_cast<const MuonOptions*>(&group.options()) != nullptr
                                    : dynamic_cast<const AdamWOptions*>(&group.options()) != nullptr;
    TORCH_CHECK_VALUE(right_type, kWho, "param group ", i, " must hold ",
                      is_muon ? "muon::MuonOptions" : "torch::optim::AdamWOptions");
    inner.set_options(group.options().clone());
  }
}

at::Tensor MuonWithAdamW::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  sync_options();
  if (muon_) muon_->step();
  if (adamw_) adamw_->step();
  return loss;
}

int64_t MuonWithAdamW::state_bytes() const {
  int64_t bytes = muon_ ? muon_->state_bytes() : 0;
  if (adamw_) {
    for (const auto& item : adamw_->state()) {
      const auto& st = static_cast<const AdamWParamState&>(*item.second);
      for (const auto* t : {&st.exp_avg(), &st.exp_avg_sq(), &st.max_exp_avg_sq()}) {
        if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
      }
    }
  }
  return bytes;
}

void MuonWithAdamW::save(OutputArchive& archive) const {
  archive.write("hybrid_format", c10::IValue(int64_t{1}));
  archive.write("param_groups/size", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (const auto i : c10::irange(param_groups_.size())) {
    OutputArchive group_archive(archive.compilation_unit());
    const bool is_muon = i < num_muon_groups_;
    group_archive.write("kind", c10::IValue(std::string(is_muon ? "muon" : "adamw")));
    group_archive.write("names", c10::IValue(c10::List<std::string>(group_names_[i])));
    OutputArchive options_archive(archive.compilation_unit());
    if (is_muon) {
      static_cast<const MuonOptions&>(param_groups_[i].options()).serialize(options_archive);
    } else {
      static_cast<const AdamWOptions&>(param_groups_[i].options()).serialize(options_archive);
    }
    group_archive.write("options", options_archive);
    archive.write("param_groups/" + std::to_string(i), group_archive);
  }
  if (muon_) {
    OutputArchive inner(archive.compilation_unit());
    muon_->save(inner);
    archive.write("muon", inner);
  }
  if (adamw_) {
    OutputArchive inner(archive.compilation_unit());
    adamw_->save(inner);
    archive.write("adamw", inner);
  }
}

void MuonWithAdamW::load(InputArchive& archive) {
  c10::IValue value;
  TORCH_CHECK_VALUE(archive.try_read("hybrid_format", value) && value.toInt() == 1, kWho,
                    "the archive was not written by muon::MuonWithAdamW::save");
  archive.read("param_groups/size", value);
  TORCH_CHECK_VALUE(value.toInt() == static_cast<int64_t>(param_groups_.size()), kWho,
                    "the archive has ", value.toInt(), " param groups, this optimizer has ",
                    param_groups_.size());
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  for (const auto i : c10::irange(param_groups_.size())) {
    const bool is_muon = i < num_muon_groups_;
    InputArchive group_archive;
    archive.read("param_groups/" + std::to_string(i), group_archive);
    group_archive.read("kind", value);
    TORCH_CHECK_VALUE(value.toStringRef() == (is_muon ? "muon" : "adamw"), kWho, "param group ", i,
                      " of the archive is an ", value.toStringRef(), " group, here it is ",
                      is_muon ? "a muon" : "an adamw", " group");
    group_archive.read("names", value);
    const auto names = value.toList();
    const auto& mine = group_names_[i];
    TORCH_CHECK_VALUE(names.size() == mine.size(), kWho, "param group ", i, " of the archive has ",
                      names.size(), " parameters, here it has ", mine.size());
    for (const auto j : c10::irange(mine.size())) {
      const auto theirs = names.get(j).toStringRef();
      TORCH_CHECK_VALUE(theirs == mine[j], kWho, "parameter ", j, " of group ", i,
                        " is '", theirs, "' in the archive and '", mine[j], "' here");
    }
    InputArchive options_archive;
    group_archive.read("options", options_archive);
    if (is_muon) {
      auto o = std::make_unique<MuonOptions>();
      o->serialize(options_archive);
      options.push_back(std::move(o));
    } else {
      auto o = std::make_unique<AdamWOptions>();
      o->serialize(options_archive);
      options.push_back(std::move(o));
    }
  }
  if (muon_) {
    InputArchive inner;
    archive.read("muon", inner);
    muon_->load(inner);
  }
  if (adamw_) {
    InputArchive inner;
    archive.read("adamw", inner);
    adamw_->load(inner);
  }
  for (const auto i : c10::irange(param_groups_.size())) param_groups_[i].set_options(std::move(options[i]));
  sync_options();
}

}  // namespace muon
