// Loading optimizer plugins (muon/plugin.h).
#include "muon/plugin.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <algorithm>

#include "muon/registry.h"

namespace muon {

std::vector<std::string> load_plugin(const std::string& path) {
  TORCH_CHECK_VALUE(!path.empty(), "[muon::load_plugin] path is empty");
  auto& registry = OptimizerRegistry::global();
  const auto before = registry.keys();
  // RTLD_GLOBAL: the plugin's symbols resolve against the one libmuon the
  // process has, so it registers in the same global registry.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    TORCH_CHECK_VALUE(false, "[muon::load_plugin] cannot load '", path.substr(0, 200),
                      "': ", std::string(why != nullptr ? why : "unknown error").substr(0, 300));
  }
  std::vector<std::string> added;
  for (const auto& name : registry.keys()) {
    if (std::find(before.begin(), before.end(), name) == before.end()) added.push_back(name);
  }
  return added;  // the library stays loaded: its entries' functions live in it
}

}  // namespace muon
