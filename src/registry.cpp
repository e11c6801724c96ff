// The optimizer registry: entries, extensions and the schema they make, the
// global registry's extensions, configs over a registry's schema, and the
// settings an optimizer reads. The built-in entries are registered in
// registry_builtins.cpp.
#include "muon/registry.h"
#include "muon/optim/weight_update_hook.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "config_internal.h"
#include "muon/optim/step_guard.h"
#include "registry_internal.h"
#include "util/names.h"

namespace muon {

using detail::clip;
using detail::join;
using detail::kRegistryWho;
using detail::reference_of;

// ---- OptimizerSettings ---------------------------------------------------------

OptimizerSettings::OptimizerSettings(std::map<std::string, FieldValue> values)
    : values_(std::move(values)) {}

const FieldValue& OptimizerSettings::get(const std::string& key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) {
    std::vector<std::string> keys;
    for (const auto& kv : values_) keys.push_back(kv.first);
    TORCH_CHECK_VALUE(false, "[muon::OptimizerSettings] no setting '", key, "'; present: ", join(keys));
  }
  return it->second;
}

namespace {
template <typename T>
const T& typed_setting(const OptimizerSettings& s, const std::string& key, FieldType want) {
  return detail::typed_value<T>(s.get(key), want, "[muon::OptimizerSettings] setting ", key);
}
}  // namespace

bool OptimizerSettings::get_bool(const std::string& key) const {
  return typed_setting<bool>(*this, key, FieldType::kBool);
}
int64_t OptimizerSettings::get_int(const std::string& key) const {
  return typed_setting<int64_t>(*this, key, FieldType::kInt);
}
double OptimizerSettings::get_double(const std::string& key) const {
  const auto& v = get(key);
  if (type_of(v) == FieldType::kInt) return static_cast<double>(std::get<int64_t>(v));
  return typed_setting<double>(*this, key, FieldType::kDouble);
}
const std::string& OptimizerSettings::get_string(const std::string& key) const {
  return typed_setting<std::string>(*this, key, FieldType::kString);
}
const std::vector<int64_t>& OptimizerSettings::get_int_list(const std::string& key) const {
  return typed_setting<std::vector<int64_t>>(*this, key, FieldType::kIntList);
}
const std::vector<std::string>& OptimizerSettings::get_string_list(const std::string& key) const {
  return typed_setting<std::vector<std::string>>(*this, key, FieldType::kStringList);
}

// ---- registry ------------------------------------------------------------------

std::vector<FieldSpec> common_fields() {
  return {
      FieldSpec::text("optimizer", "muon", "the optimizer (a registered name)"),
      FieldSpec::text("scalar_optimizer", "adamw",
                      "optimizer of the parameters Muon does not take (1-D, embeddings, head): "
                      "adamw | lion (any registered name)")
          .whole_run(),
      FieldSpec::real("lr", 3e-4, "learning rate (peak of the schedule)", 0.0),
      FieldSpec::real("weight_decay", 0.0, "weight decay coefficient", 0.0),
      FieldSpec::real("min_lr", 0.0, "learning rate at the end of the decay (main lr)", 0.0).whole_run(),
      FieldSpec::integer("lr_warmup_steps", 0, "linear warmup steps", 0.0).whole_run(),
      FieldSpec::real("lr_warmup_init", 0.0, "learning rate at step 0 of the warmup (main lr)", 0.0)
          .whole_run(),
      FieldSpec::integer("lr_decay_steps", 0, "step where the decay reaches min_lr (from step 0)", 0.0)
          .whole_run(),
      FieldSpec::text("lr_decay_style", "constant", "decay after warmup",
                      {"constant", "linear", "cosine"})
          .whole_run(),
      FieldSpec::text("weight_update_hook", "none",
                      "around the weight update (Emerging-Optimizers' hooks): hyperball (update and "
                      "weight at radius R) | radial_brake (damp changes of the weight's norm) | "
                      "relative_update (the update at the weight's norm)",
                      weight_update_hook_names()),
      FieldSpec::real("weight_update_hook_radius", 1.0, "hyperball: the radius R of the weight and update",
                      0.0)
          .exclusive_min(),
      FieldSpec::real("weight_update_hook_outward_scale", 0.5,
                      "radial_brake: fraction of a growth of the weight's norm kept", 0.0, 1.0),
      FieldSpec::real("weight_update_hook_inward_scale", 1.0,
                      "radial_brake: fraction of a shrinking of the weight's norm kept", 0.0, 1.0),
      FieldSpec::real("weight_update_hook_eps", 1e-15, "weight-update hooks: norms below it count as 0", 0.0)
          .exclusive_min(),
      FieldSpec::text("nonfinite", "error",
                      "a NaN/Inf gradient: error (raise, nothing applied) | skip_step (skip and "
                      "count the step on every rank) | propagate (no check)",
                      nonfinite_policy_names())
          .whole_run(),
  };
}

namespace {

FieldSpec prefixed(const std::string& prefix, FieldSpec f) {
  f.name = prefix + "_" + f.name;
  return f;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The first line of an error's message (a c10::Error's without its backtrace).
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

// Appends `checked()` to `live`, or while `staging` to `staged`: then a
// failed check is kept as the batch's first error (`error`), not raised.
template <typename Item, typename Checked>
void add_or_stage(bool staging, std::vector<Item>& live, std::vector<Item>& staged,
                  std::string& error, Checked checked) {
  if (!staging) {
    live.push_back(checked());
    return;
  }
  try {
    staged.push_back(checked());
  } catch (const std::exception& e) {
    if (error.empty()) error = first_line(e);
  }
}

}  // namespace

std::vector<FieldSpec> OptimizerRegistry::fields_locked(bool with_staged) const {
  auto extensions = extensions_;
  auto entries = entries_;
  if (with_staged) {
    extensions.insert(extensions.end(), staged_extensions_.begin(), staged_extensions_.end());
    entries.insert(entries.end(), staged_.begin(), staged_.end());
  }
  auto out = common_fields();
  for (const auto& x : extensions) out.insert(out.end(), x->common_fields.begin(), x->common_fields.end());
  for (const auto& e : entries) {
    for (const auto& f : e->fields) out.push_back(prefixed(e->name, f));
    for (const auto& x : extensions) {
      const auto it = x->option_fields.find(e->name);
      if (it == x->option_fields.end()) continue;
      for (const auto& f : it->second) out.push_back(prefixed(e->name, f));
    }
  }
  return out;
}

std::vector<std::string> OptimizerRegistry::names_locked() const {
  std::vector<std::string> names;
  for (const auto& e : entries_) names.push_back(e->name);
  for (const auto& e : staged_) names.push_back(e->name);
  return names;
}

bool OptimizerRegistry::staging_here() const {
  return staging_thread_ == std::this_thread::get_id();
}

void OptimizerRegistry::add(OptimizerEntry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  add_or_stage(staging_here(), entries_, staged_, staged_error_,
               [&] { return checked_locked(std::move(entry)); });
}

std::shared_ptr<const OptimizerEntry> OptimizerRegistry::checked_locked(OptimizerEntry entry) const {
  const auto& name = entry.name;
  TORCH_CHECK_VALUE(!name.empty(), kRegistryWho, "an optimizer needs a name");
  const auto names = names_locked();
  TORCH_CHECK_VALUE(!contains(names, name), kRegistryWho, "optimizer '", clip(name),
                    "' is already registered; registered: ", join(names));
  TORCH_CHECK_VALUE(entry.make_options != nullptr, kRegistryWho, "optimizer '", name,
                    "' has no make_options");
  TORCH_CHECK_VALUE(entry.factory != nullptr, kRegistryWho, "optimizer '", name, "' has no factory");
  for (const auto& other : entry.uses_fields_of) {
    TORCH_CHECK_VALUE(contains(names, other), kRegistryWho, "optimizer '", name,
                      "' uses the fields of '", other,
                      "', which is not registered; registered: ", join(names));
  }
  // Config field names must stay unique across common, extension and every
  // entry's fields.
  auto schema_fields = fields_locked(true);
  std::vector<std::string> taken;
  for (const auto& f : schema_fields) taken.push_back(f.name);
  std::vector<std::string> mine;
  for (const auto& f : entry.fields) {
    TORCH_CHECK_VALUE(!f.name.empty(), kRegistryWho, "optimizer '", name,
                      "' declares a field with no name");
    const auto full = name + "_" + f.name;
    TORCH_CHECK_VALUE(!contains(taken, full) && !contains(mine, full), kRegistryWho, "optimizer '",
                      name, "' field '", f.name, "' makes config field '", full,
                      "', which already exists");
    f.check(f.default_value);  // the default must satisfy its own check
    mine.push_back(full);
  }
  // Default rules: every field they set must exist (common, an extension's,
  // an entry's, or this one's), be per-parameter, and hold a valid value or
  // a reference.
  std::map<std::string, FieldSpec> schema;
  for (auto& f : schema_fields) schema[f.name] = std::move(f);
  for (const auto& f : entry.fields) schema[name + "_" + f.name] = prefixed(name, f);
  for (const auto& rule : entry.default_overrides) {
    TORCH_CHECK_VALUE(!rule.set_fields.empty(), kRegistryWho, "optimizer '", name,
                      "' has a default override that sets nothing");
    if (rule.match.regex) detail::compile_regex(*rule.match.regex, rule.label);
    for (const auto& [key, value] : rule.set_fields) {
      const auto it = schema.find(key);
      TORCH_CHECK_VALUE(it != schema.end(), kRegistryWho, "optimizer '", name,
                        "' default override '", rule.label, "' sets unknown field '", key, "'");
      TORCH_CHECK_VALUE(it->second.per_parameter, kRegistryWho, "optimizer '", name,
                        "' default override '", rule.label, "' sets whole-run field '", key, "'");
      const auto ref = reference_of(value);
      if (ref.empty()) {
        it->second.check(value);
      } else {
        TORCH_CHECK_VALUE(schema.count(ref) != 0 && schema.at(ref).type == it->second.type,
                          kRegistryWho, "optimizer '", name, "' default override '", rule.label,
                          "' sets ", key, " to ${", ref, "}, which is not a field of the same type");
      }
    }
  }
  return std::make_shared<const OptimizerEntry>(std::move(entry));
}

void OptimizerRegistry::extend(ConfigExtension extension) {
  std::lock_guard<std::mutex> lock(mutex_);
  add_or_stage(staging_here(), extensions_, staged_extensions_, staged_error_,
               [&] { return checked_locked(std::move(extension)); });
}

std::shared_ptr<const ConfigExtension> OptimizerRegistry::checked_locked(
    ConfigExtension extension) const {
  const auto& name = extension.name;
  TORCH_CHECK_VALUE(!name.empty(), kRegistryWho, "a config extension needs a name");
  std::vector<std::string> taken;
  for (const auto& f : fields_locked(true)) taken.push_back(f.name);
  auto add_name = [&](const FieldSpec& f, const std::string& full) {
    TORCH_CHECK_VALUE(!f.name.empty(), kRegistryWho, "extension '", name,
                      "' declares a field with no name");
    TORCH_CHECK_VALUE(!contains(taken, full), kRegistryWho, "extension '", name, "' field '",
                      f.name, "' makes config field '", full, "', which already exists");
    f.check(f.default_value);  // the default must satisfy its own check
    taken.push_back(full);
  };
  for (const auto& f : extension.common_fields) add_name(f, f.name);
  const auto names = names_locked();
  for (const auto& [optimizer, fields] : extension.option_fields) {
    TORCH_CHECK_VALUE(contains(names, optimizer), kRegistryWho, "extension '", name,
                      "' adds fields to '", optimizer,
                      "', which is not registered; registered: ", join(names));
    for (const auto& f : fields) add_name(f, optimizer + "_" + f.name);
  }
  return std::make_shared<const ConfigExtension>(std::move(extension));
}

void OptimizerRegistry::begin_staging() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK_VALUE(staging_thread_ == std::thread::id(), kRegistryWho,
                    "a plugin is already being loaded (a plugin cannot load another)");
  staging_thread_ = std::this_thread::get_id();
}

OptimizerRegistry::Staged OptimizerRegistry::end_staging(bool commit) {
  std::vector<std::shared_ptr<const OptimizerEntry>> entries;
  std::vector<std::shared_ptr<const ConfigExtension>> extensions;
  Staged out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    entries.swap(staged_);
    extensions.swap(staged_extensions_);
    out.error.swap(staged_error_);
    staging_thread_ = std::thread::id();
    for (const auto& e : entries) out.names.push_back(e->name);
    if (commit && out.error.empty()) {
      entries_.insert(entries_.end(), entries.begin(), entries.end());
      extensions_.insert(extensions_.end(), extensions.begin(), extensions.end());
    }
  }
  return out;  // what was dropped is destroyed here, before the caller unloads its code
}

bool OptimizerRegistry::has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::any_of(entries_.begin(), entries_.end(), [&](const auto& e) { return e->name == name; });
}

std::vector<std::string> OptimizerRegistry::keys() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e->name);
  return out;
}

std::shared_ptr<const OptimizerEntry> OptimizerRegistry::at(const std::string& name) const {
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& e : entries_) {
      if (e->name == name) return e;
      names.push_back(e->name);
    }
  }
  TORCH_CHECK_VALUE(false, kRegistryWho, "unknown optimizer '", clip(name), "'",
                    detail::did_you_mean(name, names), " Registered: ", join(names));
}

std::vector<FieldSpec> OptimizerRegistry::fields() const {
  const auto names = keys();
  std::lock_guard<std::mutex> lock(mutex_);
  auto out = fields_locked();
  for (auto& f : out) {
    if (f.name == "optimizer" || f.name == "scalar_optimizer") f.choices = names;
  }
  return out;
}

std::vector<FieldSpec> OptimizerRegistry::shared_fields() const {
  auto out = common_fields();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& x : extensions_) out.insert(out.end(), x->common_fields.begin(), x->common_fields.end());
  return out;
}

std::vector<FieldSpec> OptimizerRegistry::option_fields(const std::string& name) const {
  auto out = at(name)->fields;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& x : extensions_) {
    const auto it = x->option_fields.find(name);
    if (it != x->option_fields.end()) out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::vector<std::shared_ptr<const ConfigExtension>> OptimizerRegistry::extensions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return extensions_;
}

std::string OptimizerRegistry::help() const {
  std::ostringstream out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : entries_) out << "  " << std::left << std::setw(16) << e->name << e->doc << "\n";
  return out.str();
}

// ---- the global registry's extensions and configs --------------------------------

namespace {

// The functions given to extend_global, and the global registry once they ran.
struct GlobalExtensions {
  std::mutex mutex;
  std::vector<std::function<void(OptimizerRegistry&)>> pending;
  OptimizerRegistry* registry = nullptr;
};

GlobalExtensions& global_extensions() {
  static auto* g = new GlobalExtensions();  // never destroyed, as the registry
  return *g;
}

}  // namespace

void OptimizerRegistry::extend_global(std::function<void(OptimizerRegistry&)> extend) {
  TORCH_CHECK_VALUE(static_cast<bool>(extend), kRegistryWho, "extend_global needs a function");
  auto& g = global_extensions();
  OptimizerRegistry* registry = nullptr;
  {
    std::lock_guard<std::mutex> lock(g.mutex);
    if (g.registry == nullptr) {
      g.pending.push_back(std::move(extend));
      return;
    }
    registry = g.registry;
  }
  extend(*registry);
}

namespace detail {

void run_global_extensions(OptimizerRegistry& registry) {
  auto& g = global_extensions();
  std::unique_lock<std::mutex> lock(g.mutex);
  // Unlocked while each runs: one given meanwhile runs in its turn. On an
  // exception they stay pending for the registry global() builds next.
  for (size_t i = 0; i < g.pending.size(); ++i) {
    const auto extend = g.pending[i];
    lock.unlock();
    extend(registry);
    lock.lock();
  }
  g.pending.clear();
  g.registry = &registry;
}

}  // namespace detail

// The config knows only its schema (src/config.cpp); the registry gives it.
OptimizerConfig::OptimizerConfig() : OptimizerConfig(OptimizerRegistry::global()) {}

OptimizerConfig::OptimizerConfig(const OptimizerRegistry& registry)
    : OptimizerConfig(registry.fields()) {}

// ---- the settings an optimizer reads ---------------------------------------------

namespace detail {

OptimizerSettings settings_for(const OptimizerRegistry& registry, const OptimizerEntry& entry,
                               const std::map<std::string, FieldValue>& values) {
  std::map<std::string, FieldValue> out;
  for (const auto& f : registry.shared_fields()) out[f.name] = values.at(f.name);
  auto strip = [&](const std::string& name) {
    for (const auto& f : registry.option_fields(name)) out[f.name] = values.at(name + "_" + f.name);
  };
  for (const auto& other : entry.uses_fields_of) strip(other);
  strip(entry.name);
  return OptimizerSettings(std::move(out));
}

}  // namespace detail

}  // namespace muon
