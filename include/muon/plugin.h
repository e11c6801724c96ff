#pragma once

/// Loading optimizers from a shared library at run time.
///
/// A plugin is a shared library, linked against libmuon, that registers one
/// or more optimizers in `muon::OptimizerRegistry::global()` when it is
/// loaded (a namespace-scope initializer):
///
///     // sign_momentum.cpp, built as a shared library
///     static const bool registered = [] {
///       muon::OptimizerRegistry::global().add(sign_momentum_entry());
///       return true;
///     }();
///
///     auto added = muon::load_plugin("./libsign_momentum.so");  // {"sign_momentum"}
///     config.set("optimizer", "sign_momentum");
///
/// What the entry declares (options, factory, state schema) is then used as
/// a built-in's is: configs, make_optimizer in every layout, checkpoints,
/// explain, the Python package (`muon_cpp.load_plugin`) and the main job
/// (`muon-train-gpt --plugin FILE`).
#include <string>
#include <vector>

namespace muon {

/// Loads the shared library at `path` (dlopen, symbols global) and returns
/// the names its loading added to the global registry, in registration
/// order. Loading the same library again adds nothing and returns an empty
/// list. What its initializers register is checked whole before any of it
/// is added (OptimizerRegistry::begin_staging): a name already registered
/// (`muon`, or a copy of a loaded plugin at another path), a field that
/// collides, any entry `add` would refuse, and none of it is added, the
/// library is closed again, and c10::ValueError names the path and the
/// registry's reason. Raises c10::ValueError naming the path and the
/// loader's message when it cannot be loaded. In every refusal the registry
/// is unchanged. One library loads at a time; a plugin's initializers must
/// not call load_plugin.
std::vector<std::string> load_plugin(const std::string& path);

}  // namespace muon
