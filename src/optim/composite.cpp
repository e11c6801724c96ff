// Several optimizers as one torch::optim::Optimizer.
#include "muon/optim/composite.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <set>
#include <sstream>
#include <typeinfo>
#include <unordered_set>
#include <utility>

#include "muon/compat.h"
#include "muon/optim/hybrid.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"

namespace muon {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamGroup;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kWho = "[muon::CompositeOptimizer] ";

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

template <typename State, typename F>
int64_t sum_state(const Optimizer& opt, F&& tensors_of) {
  int64_t bytes = 0;
  for (const auto& item : opt.state()) {
    for (const auto* t : tensors_of(static_cast<const State&>(*item.second))) bytes += bytes_of(*t);
  }
  return bytes;
}

}  // namespace

int64_t optimizer_state_bytes(const Optimizer& opt) {
  using namespace torch::optim;  // NOLINT(google-build-using-namespace): local, many types
  if (const auto* m = dynamic_cast<const Muon*>(&opt)) return m->state_bytes();
  if (const auto* l = dynamic_cast<const Lion*>(&opt)) return l->state_bytes();
  if (const auto* c = dynamic_cast<const CompositeOptimizer*>(&opt)) return c->state_bytes();
  if (const auto* h = dynamic_cast<const MuonWithAdamW*>(&opt)) return h->state_bytes();
  if (dynamic_cast<const AdamW*>(&opt) != nullptr) {
    return sum_state<AdamWParamState>(opt, [](const AdamWParamState& s) {
      return std::vector<const at::Tensor*>{&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()};
    });
  }
  if (dynamic_cast<const Adam*>(&opt) != nullptr) {
    return sum_state<AdamParamState>(opt, [](const AdamParamState& s) {
      return std::vector<const at::Tensor*>{&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()};
    });
  }
  if (dynamic_cast<const SGD*>(&opt) != nullptr) {
    return sum_state<SGDParamState>(opt, [](const SGDParamState& s) {
      return std::vector<const at::Tensor*>{&s.momentum_buffer()};
    });
  }
  if (dynamic_cast<const Adagrad*>(&opt) != nullptr) {
    return sum_state<AdagradParamState>(
        opt, [](const AdagradParamState& s) { return std::vector<const at::Tensor*>{&s.sum()}; });
  }
  if (dynamic_cast<const RMSprop*>(&opt) != nullptr) {
    return sum_state<RMSpropParamState>(opt, [](const RMSpropParamState& s) {
      return std::vector<const at::Tensor*>{&s.square_avg(), &s.momentum_buffer(), &s.grad_avg()};
    });
  }
  return 0;
}

CompositeOptimizer::CompositeOptimizer(std::vector<CompositePart> parts)
    : Optimizer(std::vector<OptimizerParamGroup>{},
                parts.empty() || !parts[0].optimizer
                    ? nullptr
                    : parts[0].optimizer->defaults().clone()) {
  TORCH_CHECK_VALUE(!parts.empty(), kWho, "needs at least one part, got none");
  std::set<std::string> seen_names;
  std::unordered_set<const c10::TensorImpl*> seen_tensors;
  std::vector<OptimizerParamGroup> all;
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
                          "a tensor of part '", part.name, "' is already in an earlier group");
      }
      all.emplace_back(g.params(), g.options().clone());
      group_part_.push_back(pi);
      group_inner_.push_back(gi);
      names_.push_back(part.group_names.empty() ? std::vector<std::string>{}
                                                : part.group_names[gi]);
    }
  }
  parts_ = std::move(parts);
  for (const auto& g : all) add_param_group(g);
  compat::reapply_group_options(*this, all);
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

void CompositeOptimizer::sync_options() {
  TORCH_CHECK_VALUE(param_groups_.size() == group_part_.size(), kWho, "has ",
                    param_groups_.size(), " param groups but was built with ",
                    group_part_.size(), "; groups cannot be added after construction");
  for (const auto i : c10::irange(param_groups_.size())) {
    const auto& group = param_groups_[i];
    auto& inner = parts_[group_part_[i]].optimizer->param_groups()[group_inner_[i]];
    TORCH_CHECK_VALUE(group.params().size() == inner.params().size(), kWho, "param group ", i,
                      " has ", group.params().size(), " parameters but was built with ",
                      inner.params().size(), "; parameters cannot be added after construction");
    const auto& mine = group.options();
    const auto& theirs = inner.options();
    TORCH_CHECK_VALUE(typeid(mine) == typeid(theirs), kWho, "param group ", i,
                      " must hold options of type ", typeid(theirs).name(), " (part '",
                      parts_[group_part_[i]].name, "')");
    inner.set_options(mine.clone());
  }
}

at::Tensor CompositeOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  sync_options();
  for (auto& part : parts_) part.optimizer->step();
  return loss;
}

int64_t CompositeOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& part : parts_) {
    bytes += part.state_bytes ? part.state_bytes(*part.optimizer)
                              : optimizer_state_bytes(*part.optimizer);
  }
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
  TORCH_CHECK_VALUE(archive.try_read("composite_format", v) && v.toInt() == 1, kWho,
                    "the archive was not written by muon::CompositeOptimizer::save");
  archive.read("parts/size", v);
  TORCH_CHECK_VALUE(v.toInt() == static_cast<int64_t>(parts_.size()), kWho, "the archive has ",
                    v.toInt(), " parts, this optimizer has ", parts_.size());
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
  sync_options();
}

}  // namespace muon
