// Bindings of <muon/config.h>, <muon/registry.h> and <muon/groups.h>:
// configs from dicts or JSON files, the groups a config makes, explain(),
// and each optimizer's option fields.
#include <string>
#include <vector>

#include "common.h"
#include "muon/config.h"
#include "muon/groups.h"
#include "muon/optim/step_guard.h"
#include "muon/plugin.h"
#include "muon/registry.h"

namespace muon::python {

namespace {

py::dict field_dict(const FieldSpec& f) {
  py::dict d;
  d["name"] = f.name;
  d["type"] = to_string(f.type);
  d["default"] = from_field_value(f.default_value);
  d["doc"] = f.doc;
  d["choices"] = f.choices;
  d["requirement"] = f.requirement();
  d["per_parameter"] = f.per_parameter;
  return d;
}

// The registry's face: its optimizers, plugins, state schemas, config
// fields, and whether steps are whole.
void bind_registry(py::module_& m) {
  m.def(
      "optimizer_names", [] { return OptimizerRegistry::global().keys(); },
      "The registered optimizers.");
  m.def("set_whole_steps", &muon::set_whole_steps, py::arg("enabled"),
        "Whether optimizer steps are whole or nothing (default True): off, no copy of the stepped "
        "parameters and state is made, and a step that raises may leave parts of it applied.");
  m.def("whole_steps", &muon::whole_steps, "The setting of set_whole_steps.");
  m.def("load_plugin", &load_plugin, py::arg("path"),
        "Loads a shared library that registers optimizers (muon/plugin.h); returns the names it added.");
  m.def(
      "state_schema",
      [](const std::string& optimizer) {
        const auto entry = OptimizerRegistry::global().at(optimizer);
        py::list out;
        for (const auto& f : entry->state.fields) {
          py::dict d;
          d["name"] = f.name;
          d["shape"] = f.shape == StateShape::kCounter ? "counter"
                       : f.shape == StateShape::kParam ? "param"
                       : f.shape == StateShape::kWhole ? "whole"
                                                       : "rows";
          d["init"] = f.init == StateInit::kZeros ? "zeros" : "on_first_use";
          d["split"] = f.split == StateSplit::kWithRows ? "rows"
                       : f.split == StateSplit::kOwner ? "owner"
                                                       : "replicated";
          d["optional"] = static_cast<bool>(f.present);
          out.append(d);
        }
        return out;
      },
      py::arg("optimizer"), "The fields of `optimizer`'s per-parameter state (its registry entry's schema).");
  m.def(
      "config_fields",
      [] {
        py::list out;
        for (const auto& f : OptimizerRegistry::global().fields()) out.append(field_dict(f));
        return out;
      },
      "Every config field (the JSON keys).");
}

}  // namespace

void bind_config(py::module_& m) {
  py::class_<OptimizerConfig>(m, "Config", "A muon::OptimizerConfig (every field has a value).")
      .def(py::init<>())
      .def(
          "apply_json", [](OptimizerConfig& c, const std::string& text) { apply_config_json(c, text); },
          py::arg("text"), "Applies a JSON document (fields and 'overrides').")
      .def(
          "load_file", [](OptimizerConfig& c, const std::string& path) { load_config_file(c, path); },
          py::arg("path"), "Applies a JSON file.")
      .def(
          "set",
          [](OptimizerConfig& c, const std::string& key, const py::handle& value) {
            c.set(key, to_field_value(value, "config field '" + key + "'"));
          },
          py::arg("key"), py::arg("value"))
      .def(
          "get", [](const OptimizerConfig& c, const std::string& key) { return from_field_value(c.get(key)); },
          py::arg("key"))
      .def(
          "values",
          [](const OptimizerConfig& c) {
            py::dict d;
            for (const auto& [k, v] : c.values()) d[py::str(k)] = from_field_value(v);
            return d;
          },
          "Every field's value.")
      .def("to_json", &OptimizerConfig::to_json, "The config as JSON (fields and rules).");

  m.def(
      "plan_groups",
      [](const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
         const OptimizerConfig& config) {
        const auto plans = plan_groups(named_parameters(names, params), config);
        py::list out;
        for (const auto& p : plans) {
          py::dict settings;
          for (const auto& [k, v] : p.settings) settings[py::str(k)] = from_field_value(v);
          py::dict g;
          g["optimizer"] = p.optimizer;
          g["names"] = p.names;
          g["params"] = p.params;
          g["settings"] = settings;
          out.append(g);
        }
        return out;
      },
      py::arg("names"), py::arg("params"), py::arg("config"),
      "The param groups make_optimizer builds from `config`: dicts with optimizer, names, "
      "params and settings.");
  m.def(
      "explain",
      [](const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
         const OptimizerConfig& config) { return explain(named_parameters(names, params), config); },
      py::arg("names"), py::arg("params"), py::arg("config"),
      "One line per parameter: its optimizer, group and the settings that differ.");
  m.def(
      "group_fields",
      [](const std::string& optimizer) {
        py::list out;
        for (const auto& f : group_fields(optimizer)) out.append(field_dict(f));
        return out;
      },
      py::arg("optimizer"),
      "The keys of a param group of `optimizer`: lr, weight_decay and its options.");
  m.def(
      "group_settings",
      [](const std::string& optimizer, const py::dict& settings, const OptimizerConfig& config) {
        const auto full = group_settings(optimizer, to_field_map(settings, "setting"), config);
        py::dict out;
        for (const auto& f : group_fields(optimizer)) {
          out[py::str(f.name)] = from_field_value(full.get(f.name));
        }
        return out;
      },
      py::arg("optimizer"), py::arg("settings"), py::arg("config"),
      "A group's settings completed from the config and checked (ValueError naming the key).");
  bind_registry(m);
}

}  // namespace muon::python
