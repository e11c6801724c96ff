// Loading optimizer plugins (muon/plugin.h).
#include "muon/plugin.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <map>
#include <mutex>

#include "muon/registry.h"
#include "util/names.h"

namespace muon {
namespace {

constexpr const char* kWho = "[muon::load_plugin] ";

// Libraries refused earlier that stayed in the process after dlclose (a
// library with unique symbols cannot be unloaded): loading one again runs
// none of its initializers, so the refusal is repeated. Keyed by handle,
// which stays valid as long as the library stays loaded.
std::map<void*, std::string>& refused_resident() {
  static auto* refused = new std::map<void*, std::string>();  // never destroyed
  return *refused;
}

}  // namespace

std::vector<std::string> load_plugin(const std::string& path) {
  TORCH_CHECK_VALUE(!path.empty(), kWho, "path is empty");
  // One load at a time: the registry stages one library's registrations.
  static std::mutex loading;
  std::lock_guard<std::mutex> lock(loading);
  auto& registry = OptimizerRegistry::global();
  // What the library's initializers register is held back until it is
  // checked whole: all of it is added, or none (an exception thrown inside
  // dlopen would end the process).
  registry.begin_staging();
  // RTLD_GLOBAL: the plugin's symbols resolve against the one libmuon the
  // process has, so it registers in the same global registry.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  const bool loaded = handle != nullptr;
  const auto staged = registry.end_staging(/*commit=*/loaded);
  if (!loaded) {
    const char* why = ::dlerror();
    TORCH_CHECK_VALUE(false, kWho, "cannot load '", detail::clip(path, 200),
                      "': ", std::string(why != nullptr ? why : "unknown error").substr(0, 300));
  }
  std::string error = staged.error;
  const auto earlier = refused_resident().find(handle);
  if (error.empty() && staged.names.empty() && earlier != refused_resident().end()) {
    error = earlier->second;  // the same resident library again
  }
  if (error.empty()) return staged.names;  // the library stays loaded: its entries live in it
  const auto message =
      c10::str(kWho, "'", detail::clip(path, 200),
               "' is refused and nothing it registers is added: ", detail::clip(error, 400));
  ::dlclose(handle);
  void* resident = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (resident != nullptr) {
    refused_resident()[resident] = error;
    ::dlclose(resident);
  }
  TORCH_CHECK_VALUE(false, message);
}

}  // namespace muon
