// Several optimizers as one torch::optim::Optimizer.
#include "muon/optim/composite.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <typeinfo>
#include <unordered_set>
#include <utility>

#include "optim/archive_kind.h"
#include "optim/closure.h"
#include "optim/step_transaction.h"
#include "util/fault_injection.h"
#include "util/names.h"

namespace muon {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::CompositeOptimizer] ";

std::unique_ptr<OptimizerOptions> defaults_of_first(const std::vector<CompositePart>& parts) {
  if (parts.empty() || !parts[0].optimizer) return nullptr;
  return parts[0].optimizer->defaults().clone();
}

}  // namespace

// ---- GroupMirror ---------------------------------------------------------------

void GroupMirror::mirror(Optimizer& inner, std::vector<OptimizerParamGroup>& outer) {
  TORCH_INTERNAL_ASSERT(outer.size() == sources_.size(),
                        "mirrored groups must come before the outer optimizer's own");
  const auto& groups = inner.param_groups();
  for (const auto gi : c10::irange(groups.size())) {
    outer.emplace_back(groups[gi].params(), groups[gi].options().clone());
    sources_.push_back({&inner, gi});
  }
}

void GroupMirror::hand_options(const std::vector<OptimizerParamGroup>& outer, size_t extra,
                               const char* who) const {
  TORCH_CHECK_VALUE(outer.size() == sources_.size() + extra, who, "has ", outer.size(),
                    " param groups but was built with ", sources_.size() + extra,
                    "; groups cannot be added after construction");
  for (const auto i : c10::irange(sources_.size())) {
    const auto& group = outer[i];
    auto& inner = sources_[i].optimizer->param_groups()[sources_[i].group];
    TORCH_CHECK_VALUE(group.params().size() == inner.params().size(), who, "param group ", i,
                      " has ", group.params().size(), " parameters but was built with ",
                      inner.params().size(), "; parameters cannot be added after construction");
    const auto& mine = group.options();
    const auto& theirs = inner.options();
    TORCH_CHECK_VALUE(typeid(mine) == typeid(theirs), who, "param group ", i,
                      " must hold options of type ", typeid(theirs).name(), ", got ",
                      typeid(mine).name());
    inner.set_options(mine.clone());
  }
}

void GroupMirror::take_options(std::vector<OptimizerParamGroup>& outer) const {
  TORCH_INTERNAL_ASSERT(outer.size() >= sources_.size());
  for (const auto i : c10::irange(sources_.size())) {
    const auto& inner = sources_[i].optimizer->param_groups()[sources_[i].group];
    outer[i].set_options(inner.options().clone());
  }
}

// ---- CompositeOptimizer --------------------------------------------------------

CompositeOptimizer::CompositeOptimizer(std::vector<CompositePart> parts)
    : Optimizer(std::vector<OptimizerParamGroup>{}, defaults_of_first(parts)) {
  TORCH_CHECK_VALUE(!parts.empty(), kWho, "needs at least one part, got none");
  adopt(std::move(parts));
}

CompositeOptimizer::CompositeOptimizer(std::vector<CompositePart> parts,
                                       std::unique_ptr<OptimizerOptions> defaults)
    : Optimizer(std::vector<OptimizerParamGroup>{}, std::move(defaults)) {
  adopt(std::move(parts));
}

void CompositeOptimizer::adopt(std::vector<CompositePart> parts) {
  std::set<std::string> seen_names;
  std::unordered_set<const c10::TensorImpl*> seen_tensors;
  for (const auto pi : c10::irange(parts.size())) {
    auto& part = parts[pi];
    TORCH_CHECK_VALUE(!part.name.empty(), kWho, "part ", pi, " has an empty name");
    TORCH_CHECK_VALUE(part.optimizer != nullptr, kWho, "part '", part.name, "' has no optimizer");
    TORCH_CHECK_VALUE(seen_names.insert(part.name).second, kWho, "two parts are named '",
                      part.name, "'");
    const auto& groups = part.optimizer->param_groups();
    TORCH_CHECK_VALUE(part.group_names.empty() || part.group_names.size() == groups.size(), kWho,
                      "part '", part.name, "' has ", groups.size(), " groups but ",
                      part.group_names.size(), " lists of names");
    for (const auto gi : c10::irange(groups.size())) {
      const auto& g = groups[gi];
      if (!part.group_names.empty()) {
        TORCH_CHECK_VALUE(part.group_names[gi].size() == g.params().size(), kWho, "group ", gi,
                          " of part '", part.name, "' has ", g.params().size(),
                          " parameters but ", part.group_names[gi].size(), " names");
      }
      for (const auto& p : g.params()) {
        TORCH_CHECK_VALUE(seen_tensors.insert(p.unsafeGetTensorImpl()).second, kWho,
                          "some parameters appear in more than one parameter group: a tensor "
                          "of part '", part.name, "' is already in an earlier group");
      }
    }
  }
  parts_ = std::move(parts);
  for (const auto pi : c10::irange(parts_.size())) {
    auto& part = parts_[pi];
    mirror_.mirror(*part.optimizer, param_groups_);
    for (const auto gi : c10::irange(part.optimizer->param_groups().size())) {
      group_part_.push_back(pi);
      names_.push_back(part.group_names.empty() ? std::vector<std::string>{}
                                                : part.group_names[gi]);
    }
    // The composite runs the parts' checks, once, before any part steps.
    if (auto* guard = step_guard(*part.optimizer)) guard->checked_by_owner(true);
  }
  detail::check_steppable(param_groups_, kWho,
                          [this](size_t g, size_t i) { return describe(g, i); });
}

std::string CompositeOptimizer::describe(size_t group, size_t index) const {
  const auto& p = param_groups_[group].params()[index];
  if (group < names_.size() && index < names_[group].size()) {
    return c10::str("parameter '", names_[group][index], "' (shape ", p.sizes(), ")");
  }
  return detail::describe_param(p, group, index);
}

void CompositeOptimizer::check_before_step() {
  mirror_.hand_options(param_groups_, 0, kWho);
  for (const auto gi : c10::irange(param_groups_.size())) {
    detail::check_torch_options(param_groups_[gi].options(), kWho, gi);
  }
  for (auto& part : parts_) {
    if (auto* guard = step_guard(*part.optimizer)) guard->check_before_step();
    if (part.hooks) part.hooks->check(*part.optimizer);
  }
  detail::check_steppable(param_groups_, kWho,
                          [this](size_t g, size_t i) { return describe(g, i); });
}

void CompositeOptimizer::set_agreed_by_layout(bool agreed) {
  StepGuard::set_agreed_by_layout(agreed);
  for (auto& part : parts_) {
    if (auto* guard = step_guard(*part.optimizer)) guard->set_agreed_by_layout(agreed);
  }
}

std::pair<int64_t, int64_t> CompositeOptimizer::max_over_processes(int64_t code) {
  std::pair<int64_t, int64_t> worst{code, 0};
  for (auto& part : parts_) {
    auto* guard = step_guard(*part.optimizer);
    if (guard == nullptr) continue;
    // The first part whose processes raise the code names the rank; later
    // parts only see the code already agreed.
    const auto agreed = guard->max_over_processes(worst.first);
    if (agreed.first > worst.first) worst = agreed;
  }
  return worst;
}

const std::string& CompositeOptimizer::part_name(size_t i) const {
  TORCH_CHECK_VALUE(i < parts_.size(), kWho, "part index ", i, " out of range for ",
                    parts_.size(), " parts");
  return parts_[i].name;
}

Optimizer& CompositeOptimizer::part(size_t i) {
  TORCH_CHECK_VALUE(i < parts_.size(), kWho, "part index ", i, " out of range for ",
                    parts_.size(), " parts");
  return *parts_[i].optimizer;
}

Optimizer* CompositeOptimizer::find_part(const std::string& name) {
  for (auto& p : parts_) {
    if (p.name == name) return p.optimizer.get();
  }
  return nullptr;
}

size_t CompositeOptimizer::part_of_group(size_t group) const {
  TORCH_CHECK_VALUE(group < group_part_.size(), kWho, "group index ", group, " out of range for ",
                    group_part_.size(), " groups");
  return group_part_[group];
}

const std::vector<std::string>& CompositeOptimizer::group_names(size_t group) const {
  TORCH_CHECK_VALUE(group < names_.size(), kWho, "group index ", group, " out of range for ",
                    names_.size(), " groups");
  return names_[group];
}

at::Tensor CompositeOptimizer::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss = muon::detail::loss_of(closure);
  if (!admit_step(param_groups_, kWho, [this] { check_before_step(); },
                  [this](size_t g, size_t i) { return describe(g, i); })) {
    return loss;
  }
  // One transaction over every part: a part that raises (a matrix function
  // that fails, memory) leaves no part stepped.
  size_t stepping = 0;
  detail::run_whole_step(
      *this, kWho,
      [&] {
        for (; stepping < parts_.size(); ++stepping) {
          auto& part = parts_[stepping];
          if (part.hooks) part.hooks->before_step(*part.optimizer);
          part.optimizer->step();
          if (part.hooks) part.hooks->after_step(*part.optimizer);
          detail::fault_point("a part of muon::CompositeOptimizer");
        }
      },
      [&] { return "optimizer '" + parts_[std::min(stepping, parts_.size() - 1)].name + "'"; });
  return loss;
}

int64_t CompositeOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& part : parts_) bytes += optimizer_state_bytes(*part.optimizer);
  return bytes;
}

void CompositeOptimizer::save(OutputArchive& archive) const {
  archive.write("composite_format", c10::IValue(int64_t{1}));
  archive.write("parts/size", c10::IValue(static_cast<int64_t>(parts_.size())));
  for (const auto pi : c10::irange(parts_.size())) {
    OutputArchive inner(archive.compilation_unit());
    parts_[pi].optimizer->save(inner);
    archive.write("parts/" + std::to_string(pi) + "/name", c10::IValue(parts_[pi].name));
    archive.write("parts/" + std::to_string(pi) + "/optimizer", inner);
  }
  archive.write("param_groups/size", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (const auto i : c10::irange(param_groups_.size())) {
    OutputArchive group(archive.compilation_unit());
    group.write("part", c10::IValue(static_cast<int64_t>(group_part_[i])));
    group.write("params/size",
                c10::IValue(static_cast<int64_t>(param_groups_[i].params().size())));
    group.write("names", c10::IValue(c10::List<std::string>(names_[i])));
    OutputArchive options(archive.compilation_unit());
    param_groups_[i].options().serialize(options);
    group.write("options", options);
    archive.write("param_groups/" + std::to_string(i), group);
  }
}

void CompositeOptimizer::load(InputArchive& archive) {
  c10::IValue v;
  const auto mine = [this] {
    return c10::str("a muon::CompositeOptimizer of ", parts_.size(), " part",
                    parts_.size() == 1 ? "" : "s", " (",
                    detail::join(parts_, [](const CompositePart& p) { return "'" + p.name + "'"; }),
                    ") on this process");
  };
  TORCH_CHECK_VALUE(archive.try_read("composite_format", v) && v.toInt() == 1, kWho,
                    "the archive holds ", detail::describe_archive(archive), "; this optimizer is ",
                    mine(), ". Load an archive written by the same optimizer in the same layout "
                    "and world size");
  archive.read("parts/size", v);
  TORCH_CHECK_VALUE(v.toInt() == static_cast<int64_t>(parts_.size()), kWho, "the archive holds ",
                    detail::describe_archive(archive), "; this optimizer is ", mine());
  for (const auto pi : c10::irange(parts_.size())) {
    archive.read("parts/" + std::to_string(pi) + "/name", v);
    TORCH_CHECK_VALUE(v.toStringRef() == parts_[pi].name, kWho, "part ", pi, " is '",
                      v.toStringRef(), "' in the archive and '", parts_[pi].name, "' here");
  }
  archive.read("param_groups/size", v);
  TORCH_CHECK_VALUE(v.toInt() == static_cast<int64_t>(param_groups_.size()), kWho,
                    "the archive has ", v.toInt(), " param groups, this optimizer has ",
                    param_groups_.size());
  // Structure and options first; nothing changes until all of it has been read.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  for (const auto i : c10::irange(param_groups_.size())) {
    InputArchive group;
    archive.read("param_groups/" + std::to_string(i), group);
    group.read("part", v);
    TORCH_CHECK_VALUE(v.toInt() == static_cast<int64_t>(group_part_[i]), kWho, "param group ", i,
                      " belongs to part ", v.toInt(), " in the archive and to part ",
                      group_part_[i], " ('", parts_[group_part_[i]].name, "') here");
    group.read("params/size", v);
    TORCH_CHECK_VALUE(v.toInt() == static_cast<int64_t>(param_groups_[i].params().size()), kWho,
                      "param group ", i, " of the archive has ", v.toInt(),
                      " parameters, here it has ", param_groups_[i].params().size());
    group.read("names", v);
    const auto names = v.toList();
    const auto& mine = names_[i];
    if (!mine.empty() && names.size() > 0) {
      TORCH_CHECK_VALUE(names.size() == mine.size(), kWho, "param group ", i,
                        " of the archive names ", names.size(), " parameters, here ",
                        mine.size());
      for (const auto j : c10::irange(mine.size())) {
        const auto theirs = names.get(j).toStringRef();
        TORCH_CHECK_VALUE(theirs == mine[j], kWho, "parameter ", j, " of group ", i, " is '",
                          theirs, "' in the archive and '", mine[j], "' here");
      }
    }
    InputArchive options_archive;
    group.read("options", options_archive);
    auto o = param_groups_[i].options().clone();
    o->serialize(options_archive);
    options.push_back(std::move(o));
  }
  // A part can still reject its archive (e.g. a shape differs): keep a copy
  // of every part's state and put it back if any part fails.
  std::vector<std::string> backups;
  for (const auto& part : parts_) {
    OutputArchive copy;
    part.optimizer->save(copy);
    std::ostringstream out;
    copy.save_to(out);
    backups.push_back(out.str());
  }
  size_t loading = 0;
  try {
    for (; loading < parts_.size(); ++loading) {
      InputArchive inner;
      archive.read("parts/" + std::to_string(loading) + "/optimizer", inner);
      parts_[loading].optimizer->load(inner);
    }
  } catch (...) {
    for (size_t pi = 0; pi <= loading && pi < parts_.size(); ++pi) {
      std::istringstream in(backups[pi]);
      InputArchive copy;
      copy.load_from(in);
      parts_[pi].optimizer->load(copy);
    }
    throw;
  }
  for (const auto i : c10::irange(param_groups_.size())) {
    param_groups_[i].set_options(std::move(options[i]));
  }
  mirror_.hand_options(param_groups_, 0, kWho);
}

}  // namespace muon
