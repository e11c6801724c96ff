// Bindings of the optimizers: one `Engine` holds the C++ optimizer that a
// Python muon_cpp optimizer (a torch.optim.Optimizer, python/muon_cpp/optim.py)
// drives. Python keeps param_groups (dicts) and state (dicts of tensors) as
// torch.optim does; the engine takes edited group values at each step, runs
// the step in one call with the GIL released, and shares its state tensors
// with Python (the same tensor objects, updated in place by the step).
#include <c10/util/Exception.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "muon/compat.h"
#include "muon/distributed/layouts/layerwise.h"
#include "muon/distributed/layouts/layout.h"
#include "muon/distributed/layouts/make.h"
#include "muon/groups.h"
#include "muon/optim/composite.h"
#include "muon/optim/state_bytes.h"
#include "muon/registry.h"
#include "muon/scaling.h"

namespace muon::python {

namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;

// Keys a group cannot change after construction: the layouts laid their
// work out from them, the weight-update hooks were built from them, and
// whole-run fields are shared by every group.
const std::set<std::string> kFixedKeys = {"tp_mode",
                                          "stacked_experts",
                                          "split_qkv",
                                          "qkv_split_sizes",
                                          "num_query_groups",
                                          "weight_update_hook",
                                          "weight_update_hook_radius",
                                          "weight_update_hook_outward_scale",
                                          "weight_update_hook_inward_scale",
                                          "weight_update_hook_eps"};

// The optimizer that keeps a parameter's state and the registry entry whose
// state schema describes it.
struct Leaf {
  Optimizer* optimizer = nullptr;
  std::shared_ptr<const OptimizerEntry> entry;
};

struct GroupRecord {
  std::string optimizer;
  std::vector<std::pair<std::string, bool>> keys;  // key, fixed after construction
  std::map<std::string, FieldValue> values;        // as last applied
  size_t num_params = 0;
  int64_t index = -1;                               // in the optimizer's param_groups
};

class Engine {
 public:
  Engine(const py::list& groups, const OptimizerConfig& config, const distributed::DistributedLayout& layout)
      : config_(config) {
    std::vector<GroupSpec> specs;
    for (size_t i = 0; i < groups.size(); ++i) {
      const auto g = groups[i].cast<py::dict>();
      GroupSpec spec;
      spec.optimizer = g["optimizer"].cast<std::string>();
      spec.names = g["names"].cast<std::vector<std::string>>();
      spec.params = g["params"].cast<std::vector<at::Tensor>>();
      spec.settings = to_field_map(g["settings"].cast<py::dict>(),
                                   "param_groups[" + std::to_string(i) + "]");
      specs.push_back(std::move(spec));
    }
    // Building a distributed layout runs collectives: without the GIL, as
    // step(). A c10d worker thread that drops the last reference to a tensor
    // Python made (a collective's output) takes the GIL to free its Python
    // object while it holds the queue's lock; holding the GIL here while
    // waiting on a collective queued behind it would deadlock the rank.
    // The Python layouts are Layouts whose gradients PyTorch reduces (DDP,
    // FSDP2, muon_cpp.distributed.all_reduce_gradients): one agreement per
    // step, then the optimizer.
    auto layout_groups = distributed::LayoutGroups()
                      .world(layout.group)
                      .tensor_parallel(layout.tensor_parallel)
                      .row_shards(layout.row_shards)
                      .gradients_reduced(true);
    {
      py::gil_scoped_release release;
      layout_ = std::make_unique<distributed::Layout>(specs, config_, std::move(layout_groups));
    }
    optimizer_ = &layout_->optimizer();
    for (auto& holder : state_holders(*optimizer_, "muon_cpp: ")) {
      for (const auto& g : holder.optimizer->param_groups()) {
        for (const auto& p : g.params()) leaves_[p.unsafeGetTensorImpl()] = {holder.optimizer, holder.entry};
      }
    }
    const auto& registry = OptimizerRegistry::global();
    for (size_t i = 0; i < specs.size(); ++i) {
      GroupRecord r;
      r.optimizer = specs[i].optimizer;
      const auto settings = group_settings(r.optimizer, specs[i].settings, config_);
      // A hooked group's decay method is fixed too: its hook was built for
      // it (its weight_decay stays editable: the hook reads it at each step).
      const bool hooked = settings.has("weight_update_hook") && settings.get_string("weight_update_hook") != "none";
      for (const auto& f : group_fields(r.optimizer, registry)) {
        const auto ends = [&f](const std::string& tail) {
          return f.name.size() >= tail.size() && f.name.compare(f.name.size() - tail.size(), tail.size(), tail) == 0;
        };
        const bool decay_method = ends("weight_decay_mode") || ends("weight_decay_method");
        r.keys.emplace_back(f.name, !f.per_parameter || kFixedKeys.count(f.name) != 0 || (hooked && decay_method));
        r.values[f.name] = settings.get(f.name);
      }
      r.num_params = specs[i].params.size();
      r.index = layout_->group_index()[i];
      records_.push_back(std::move(r));
      for (const auto& p : specs[i].params) params_.push_back(p);
    }
  }

  // Takes the values of `param_groups` (edited by the user or a scheduler),
  // checked for every group before any is applied, then steps with the GIL
  // released and refreshes `state` (torch.optim's dict of dicts).
  void step(const py::list& param_groups, const py::object& state) {
    apply_groups(param_groups);
    {
      py::gil_scoped_release release;
      const auto start = std::chrono::steady_clock::now();
      layout_->step();
      last_step_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (!state.is_none()) refresh_state(state);
  }

  // Checks and applies the group values without stepping.
  void apply_groups(const py::list& param_groups) {
    TORCH_CHECK_VALUE(param_groups.size() == records_.size(), "muon_cpp: the optimizer was built with ",
                      records_.size(), " param groups, param_groups has ", param_groups.size(),
                      "; groups cannot be added or removed after construction");
    std::vector<std::pair<size_t, std::map<std::string, FieldValue>>> changed;
    for (size_t i = 0; i < records_.size(); ++i) {
      const auto& r = records_[i];
      const auto g = param_groups[i].cast<py::dict>();
      const std::string where = "param_groups[" + std::to_string(i) + "]";
      TORCH_CHECK_VALUE(g.contains("params") && py::len(g["params"]) == r.num_params, "muon_cpp: ",
                        where, " was built with ", r.num_params,
                        " parameters; parameters cannot be added or removed after construction");
      std::map<std::string, FieldValue> values;
      bool differs = false;
      for (const auto& [key, fixed] : r.keys) {
        TORCH_CHECK_VALUE(g.contains(key.c_str()), "muon_cpp: ", where, " has no key '", key, "'");
        auto v = to_field_value(g[key.c_str()], where + "['" + key + "']");
        const auto& old = r.values.at(key);
        // An int where a double was is the same value (lr = 1 after lr = 1.0).
        if (std::holds_alternative<double>(old) && std::holds_alternative<int64_t>(v)) {
          v = FieldValue(static_cast<double>(std::get<int64_t>(v)));
        }
        if (!(v == old)) {
          TORCH_CHECK_VALUE(!fixed, "muon_cpp: ", where, "['", key, "'] is fixed at construction (",
                            to_string(old), "), got ", to_string(v).substr(0, 80),
                            "; build a new optimizer to change it");
          differs = true;
        }
        values[key] = std::move(v);
      }
      if (differs) changed.emplace_back(i, std::move(values));
    }
    if (changed.empty()) return;
    // Every changed group is checked and its options built before any is set.
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
    const auto& registry = OptimizerRegistry::global();
    for (auto& [i, values] : changed) {
      const auto& r = records_[i];
      try {
        const auto settings = group_settings(r.optimizer, values, config_);
        options.push_back(registry.at(r.optimizer)->make_options(settings));
        if (auto* muon_options = dynamic_cast<MuonOptions*>(options.back().get())) muon_options->validate();
      } catch (const c10::ValueError& e) {
        TORCH_CHECK_VALUE(false, "muon_cpp: param_groups[", i, "]: ", e.what_without_backtrace());
      }
    }
    for (size_t k = 0; k < changed.size(); ++k) {
      auto& r = records_[changed[k].first];
      if (r.index >= 0) {
        optimizer_->param_groups()[static_cast<size_t>(r.index)].set_options(std::move(options[k]));
      }
      r.values = std::move(changed[k].second);
    }
  }

  // The state of `param` as a dict, or None when it has none (no step yet,
  // or another rank holds it).
  py::object state_of(const at::Tensor& param) const {
    const auto* leaf = leaf_of(param);
    auto* st = leaf == nullptr ? nullptr : find_state(*leaf, param);
    if (st == nullptr) return py::none();
    py::dict d;
    fill(*leaf, *st, d);
    return py::object(std::move(d));
  }

  // Replaces every parameter's state with `states` (param → dict of
  // torch.optim's keys), each field checked against its optimizer's state
  // schema (shape, dtype, device) before anything changes.
  void load_state(const py::dict& states) {
    const std::string who = "muon_cpp: load_state_dict: ";
    std::vector<std::pair<Optimizer*, std::pair<compat::StateKey, std::unique_ptr<OptimizerParamState>>>> fresh;
    for (const auto& [key, value] : states) {
      const auto param = key.cast<at::Tensor>();
      const auto* leaf = leaf_of(param);
      TORCH_CHECK_VALUE(leaf != nullptr, who, "state for a parameter of shape ", param.sizes(),
                        " that this optimizer does not step on this rank");
      const auto& schema = leaf->entry->state;
      auto st = schema.make();
      const auto fields = schema.values(*st);
      for (const auto& [k, v] : value.cast<py::dict>()) {
        const auto name = k.cast<std::string>();
        const StateValue* field = nullptr;
        for (const auto& f : fields) {
          if (f.field->name == name) field = &f;
        }
        if (field == nullptr && name == "step") continue;  // torch.optim's, for a kind without a counter
        TORCH_CHECK_VALUE(field != nullptr, who, "unknown state key '", name.substr(0, 60), "' for ",
                          leaf->entry->name, " (its state: ", schema.describe().substr(0, 200), ")");
        if (field->counter != nullptr) {
          // An int, or torch.optim's 0-d tensor.
          *field->counter = py::int_(py::reinterpret_borrow<py::object>(v)).cast<int64_t>();
          continue;
        }
        if (v.is_none()) continue;
        auto t = v.cast<at::Tensor>();
        StateSchema::check(*field->field, t, *leaf->optimizer, param, who);
        // A copy: the step updates state in place, and the dict's tensors may
        // be another optimizer's live state (torch 2.x's load_state_dict
        // hands them over without copying).
        *field->tensor = t.clone(at::MemoryFormat::Contiguous);
      }
      schema.complete(*st, *leaf->optimizer, options_of(*leaf, param), param);
      fresh.emplace_back(leaf->optimizer, std::make_pair(compat::state_key(param), std::move(st)));
    }
    std::set<Optimizer*> seen;
    for (const auto& [p, leaf] : leaves_) {
      if (seen.insert(leaf.optimizer).second) leaf.optimizer->state().clear();
    }
    for (auto& [leaf, entry] : fresh) leaf->state()[entry.first] = std::move(entry.second);
  }

  std::vector<int64_t> group_index() const {
    std::vector<int64_t> out;
    for (const auto& r : records_) out.push_back(r.index);
    return out;
  }

  int64_t state_bytes() const {
    if (const auto* s = dynamic_cast<const StateBytes*>(optimizer_)) return s->state_bytes();
    return 0;
  }

  std::vector<int64_t> owners() const {
    if (const auto* l = dynamic_cast<const distributed::LayerwiseOptimizer*>(optimizer_)) return l->owners();
    return {};
  }

  // Seconds the last step spent inside the C++ optimizer (for measuring
  // what the Python side adds around it).
  double last_step_seconds() const { return last_step_seconds_; }

  bool steps_here(const at::Tensor& param) const {
    return leaf_of(param) != nullptr;
  }

 private:
  const Leaf* leaf_of(const at::Tensor& param) const {
    const auto it = leaves_.find(param.unsafeGetTensorImpl());
    return it == leaves_.end() ? nullptr : &it->second;
  }

  static OptimizerParamState* find_state(const Leaf& leaf, const at::Tensor& param) {
    auto& map = leaf.optimizer->state();
    const auto s = map.find(compat::state_key(param));
    return s == map.end() ? nullptr : s->second.get();
  }

  // The options of the group of `leaf` that holds `param`.
  static const torch::optim::OptimizerOptions& options_of(const Leaf& leaf, const at::Tensor& param) {
    for (const auto& g : leaf.optimizer->param_groups()) {
      for (const auto& p : g.params()) {
        if (p.is_same(param)) return g.options();
      }
    }
    return leaf.optimizer->param_groups().at(0).options();
  }

  static void fill(const Leaf& leaf, OptimizerParamState& st, py::dict& d) {
    for (const auto& v : leaf.entry->state.values(st)) {
      if (v.counter != nullptr) {
        d[v.field->name.c_str()] = *v.counter;
      } else if (v.tensor->defined()) {
        d[v.field->name.c_str()] = *v.tensor;
      }
    }
  }

  void refresh_state(const py::object& state) const {
    for (const auto& p : params_) {
      const auto* leaf = leaf_of(p);
      auto* st = leaf == nullptr ? nullptr : find_state(*leaf, p);
      if (st == nullptr) continue;
      auto entry = state[py::cast(p)];  // torch.optim's state is a defaultdict(dict)
      auto d = py::reinterpret_borrow<py::dict>(entry);
      fill(*leaf, *st, d);
    }
  }

  OptimizerConfig config_;
  std::unique_ptr<distributed::Layout> layout_;
  Optimizer* optimizer_ = nullptr;
  std::unordered_map<const void*, Leaf> leaves_;
  std::vector<GroupRecord> records_;
  std::vector<at::Tensor> params_;
  double last_step_seconds_ = 0.0;
};

}  // namespace

void bind_optim(py::module_& m) {
  py::class_<Engine>(m, "Engine",
                     "The C++ optimizer behind a muon_cpp optimizer (see muon_cpp.optim).")
      .def(py::init<const py::list&, const OptimizerConfig&, const distributed::DistributedLayout&>(),
           py::arg("groups"), py::arg("config"), py::arg("layout"))
      .def("step", &Engine::step, py::arg("param_groups"), py::arg("state"),
           "Applies edited group values, steps (GIL released) and refreshes `state`.")
      .def("apply_groups", &Engine::apply_groups, py::arg("param_groups"))
      .def("state_of", &Engine::state_of, py::arg("param"))
      .def("load_state", &Engine::load_state, py::arg("states"))
      .def("group_index", &Engine::group_index)
      .def("state_bytes", &Engine::state_bytes)
      .def("owners", &Engine::owners)
      .def("steps_here", &Engine::steps_here, py::arg("param"))
      .def("last_step_seconds", &Engine::last_step_seconds,
           "Seconds the last step spent inside the C++ optimizer.");
}

}  // namespace muon::python
