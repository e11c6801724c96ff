// The optimizer registry, the built-in entries, parameter resolution and
// make_optimizer.
#include "muon/registry.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <array>
#include <iomanip>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "muon/compat.h"
#include "muon/newton_schulz.h"
#include "muon/optim/adaptive_muon.h"
#include "muon/optim/lion.h"
#include "muon/optim/muon.h"
#include "muon/optim/routing.h"
#include "muon/scaling.h"

namespace muon {
namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamGroup;

constexpr const char* kRegistry = "[muon::OptimizerRegistry] ";
constexpr const char* kMake = "[muon::make_optimizer] ";

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// "${field}" → "field"; empty when `v` is not a reference.
std::string reference_of(const FieldValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  if (s == nullptr || s->size() < 4 || s->rfind("${", 0) != 0 || s->back() != '}') return {};
  return s->substr(2, s->size() - 3);
}

// Builds an optimizer of type Opt over groups whose options are Options;
// the first group's options are the defaults (every group carries its own).
template <typename Opt, typename Options>
std::unique_ptr<Optimizer> build(std::vector<OptimizerParamGroup> groups) {
  const auto defaults = static_cast<const Options&>(groups.at(0).options());
  auto opt = std::make_unique<Opt>(groups, defaults);
  compat::reapply_group_options(*opt, groups);
  return opt;
}

at::ScalarType parse_ns_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  return at::kDouble;  // "float64": the only other choice the schema allows
}

// ---- built-in entries ----------------------------------------------------------

std::vector<OverrideRule> scalar_defaults(const std::string& who) {
  return {OverrideRule().match_max_ndim(1).set("optimizer", "${scalar_optimizer}").named(who + " default: ndim < 2"),
          OverrideRule().match_embedding().set("optimizer", "${scalar_optimizer}").named(who + " default: embedding"),
          OverrideRule().match_head().set("optimizer", "${scalar_optimizer}").named(who + " default: output head")};
}

std::vector<FieldSpec> muon_fields() {
  return {
      FieldSpec::real("momentum", kDefaultMuonMomentum, "momentum μ", 0.0, 1.0).exclusive_max(),
      FieldSpec::boolean("nesterov", true, "Nesterov look-ahead update"),
      FieldSpec::text("momentum_style", "ema", "momentum accumulation", {"ema", "classic"}),
      FieldSpec::text("weight_decay_mode", "decoupled", "how weight decay enters the step",
                      {"decoupled", "independent", "l2"}),
      FieldSpec::text("coefficient_type", "quintic", "Newton–Schulz coefficient set",
                      coefficient_set_names()),
      FieldSpec::integer("num_ns_steps", 0, "Newton–Schulz steps (0: the set's default)", 0.0,
                         static_cast<double>(kMaxNsSteps - 1)),
      FieldSpec::real("ns_eps", kDefaultNsEps, "Newton–Schulz normalization epsilon", 0.0)
          .exclusive_min(),
      FieldSpec::text("ns_compute_dtype", "float32", "Newton–Schulz compute dtype",
                      {"float32", "bfloat16", "float64"}),
      FieldSpec::text("scale_mode", "spectral", "shape-dependent scale of the update",
                      scale_mode_names()),
      FieldSpec::real("extra_scale_factor", 1.0, "extra multiplier of the scale", 0.0)
          .exclusive_min(),
      FieldSpec::boolean("stacked_experts", false,
                         "treat ndim >= 3 parameters as stacks of expert matrices"),
      FieldSpec::boolean("split_qkv", false,
                         "split fused QKV matrices into qkv_split_sizes blocks (set it per "
                         "parameter with an override rule)"),
      FieldSpec::int_list("qkv_split_sizes", {}, "rows of each QKV block per query group", 1.0),
      FieldSpec::integer("num_query_groups", 1, "query groups of a split QKV matrix", 1.0),
      FieldSpec::text("tp_mode", "duplicated",
                      "tensor-parallel orthogonalization (only duplicated without TP)",
                      {"duplicated", "distributed", "blockwise"}),
  };
}

MuonOptions muon_options(const OptimizerSettings& s) {
  MuonOptions o(s.get_double("lr"));
  o.momentum(s.get_double("momentum"))
      .nesterov(s.get_bool("nesterov"))
      .weight_decay(s.get_double("weight_decay"))
      .extra_scale_factor(s.get_double("extra_scale_factor"))
      .stacked_experts(s.get_bool("stacked_experts"));
  o.momentum_style(s.get_string("momentum_style"));
  o.weight_decay_mode(s.get_string("weight_decay_mode"));
  o.scale_mode(s.get_string("scale_mode"));
  o.ns_coefficients(s.get_string("coefficient_type"));
  if (s.get_int("num_ns_steps") > 0) o.ns_steps(s.get_int("num_ns_steps"));
  o.ns_eps(s.get_double("ns_eps"));
  o.ns_compute_dtype(parse_ns_dtype(s.get_string("ns_compute_dtype")));
  if (s.get_bool("split_qkv")) {
    TORCH_CHECK_VALUE(!s.get_int_list("qkv_split_sizes").empty(),
                      "muon_split_qkv is true but muon_qkv_split_sizes is empty");
    o.split_sizes(s.get_int_list("qkv_split_sizes")).num_query_groups(s.get_int("num_query_groups"));
  }
  o.validate();
  return o;
}

OptimizerEntry muon_entry() {
  OptimizerEntry e;
  e.name = "muon";
  e.doc = "Muon (muon::Muon): momentum orthogonalized by Newton–Schulz; 1-D, embedding and "
          "head parameters go to scalar_optimizer";
  e.fields = muon_fields();
  e.make_options = [](const OptimizerSettings& s) { return std::make_unique<MuonOptions>(muon_options(s)); };
  e.factory = [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>&) {
    return build<Muon, MuonOptions>(std::move(groups));
  };
  e.default_overrides = scalar_defaults("muon");
  return e;
}

OptimizerEntry adaptive_muon_entry() {
  OptimizerEntry e;
  e.name = "adaptive_muon";
  e.doc = "Muon with a NorMuon (per row) or AdaMuon (per element) second moment "
          "(muon::AdaptiveMuon); reads the muon_* fields too";
  e.fields = {
      FieldSpec::text("mode", "normuon", "second moment: normuon (per row) | adamuon (per element)",
                      {"normuon", "adamuon"})
          .whole_run(),
      FieldSpec::real("beta2", 0.95, "decay of the second moment", 0.0, 1.0).exclusive_max().whole_run(),
      FieldSpec::real("eps", 1e-8, "added to the square root of the second moment", 0.0)
          .exclusive_min()
          .whole_run(),
  };
  e.uses_fields_of = {"muon"};
  e.make_options = [](const OptimizerSettings& s) { return std::make_unique<MuonOptions>(muon_options(s)); };
  e.factory = [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>& settings) {
    const auto& s = settings.at(0);  // whole-run fields: equal in every group
    AdaptiveMuonOptions adaptive;
    adaptive.mode(s.get_string("mode")).beta2(s.get_double("beta2")).eps(s.get_double("eps"));
    const auto defaults = static_cast<const MuonOptions&>(groups.at(0).options());
    auto opt = std::make_unique<AdaptiveMuon>(groups, defaults, adaptive);
    compat::reapply_group_options(*opt, groups);
    return std::unique_ptr<Optimizer>(std::move(opt));
  };
  e.default_overrides = scalar_defaults("adaptive_muon");
  return e;
}

OptimizerEntry adam_entry() {
  OptimizerEntry e;
  e.name = "adam";
  e.doc = "Adam (torch::optim::Adam; weight_decay is L2)";
  e.fields = {
      FieldSpec::real("beta1", 0.9, "first-moment decay (adam and adamw)", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("beta2", 0.95, "second-moment decay (adam and adamw)", 0.0, 1.0).exclusive_max(),
      FieldSpec::real("eps", 1e-8, "denominator epsilon (adam and adamw)", 0.0).exclusive_min(),
  };
  e.make_options = [](const OptimizerSettings& s) {
    return std::make_unique<torch::optim::AdamOptions>(
        torch::optim::AdamOptions(s.get_double("lr"))
            .betas(std::make_tuple(s.get_double("beta1"), s.get_double("beta2")))
            .eps(s.get_double("eps"))
            .weight_decay(s.get_double("weight_decay")));
  };
  e.factory = [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>&) {
    return build<torch::optim::Adam, torch::optim::AdamOptions>(std::move(groups));
  };
  return e;
}

OptimizerEntry adamw_entry() {
  OptimizerEntry e;
  e.name = "adamw";
  e.doc = "AdamW (torch::optim::AdamW; decoupled weight decay); reads the adam_* fields";
  e.uses_fields_of = {"adam"};
  e.make_options = [](const OptimizerSettings& s) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(s.get_double("lr"))
            .betas(std::make_tuple(s.get_double("beta1"), s.get_double("beta2")))
            .eps(s.get_double("eps"))
            .weight_decay(s.get_double("weight_decay")));
  };
  e.factory = [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>&) {
    return build<torch::optim::AdamW, torch::optim::AdamWOptions>(std::move(groups));
  };
  return e;
}

OptimizerEntry sgd_entry() {
  OptimizerEntry e;
  e.name = "sgd";
  e.doc = "SGD with momentum (torch::optim::SGD; weight_decay is L2)";
  e.fields = {
      FieldSpec::real("momentum", 0.9, "momentum", 0.0, 1.0).exclusive_max(),
      FieldSpec::boolean("nesterov", false, "Nesterov momentum (needs momentum > 0, dampening 0)"),
      FieldSpec::real("dampening", 0.0, "dampening of the momentum", 0.0, 1.0),
  };
  e.make_options = [](const OptimizerSettings& s) {
    const bool nesterov = s.get_bool("nesterov");
    TORCH_CHECK_VALUE(!nesterov || (s.get_double("momentum") > 0 && s.get_double("dampening") == 0),
                      "sgd_nesterov needs sgd_momentum > 0 and sgd_dampening 0, got momentum ",
                      s.get_double("momentum"), ", dampening ", s.get_double("dampening"));
    return std::make_unique<torch::optim::SGDOptions>(
        torch::optim::SGDOptions(s.get_double("lr"))
            .momentum(s.get_double("momentum"))
            .nesterov(nesterov)
            .dampening(s.get_double("dampening"))
            .weight_decay(s.get_double("weight_decay")));
  };
  e.factory = [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>&) {
    return build<torch::optim::SGD, torch::optim::SGDOptions>(std::move(groups));
  };
  return e;
}

OptimizerEntry lion_entry() {
  OptimizerEntry e;
  e.name = "lion";
  e.doc = "Lion (muon::Lion): sign of interpolated momentum, decoupled weight decay";
  e.fields = {
      FieldSpec::real("beta1", 0.9, "interpolation weight of the momentum in the update", 0.0, 1.0)
          .exclusive_max(),
      FieldSpec::real("beta2", 0.99, "momentum decay", 0.0, 1.0).exclusive_max(),
  };
  e.make_options = [](const OptimizerSettings& s) {
    auto o = std::make_unique<LionOptions>(s.get_double("lr"));
    o->beta1(s.get_double("beta1")).beta2(s.get_double("beta2")).weight_decay(s.get_double("weight_decay"));
    o->validate();
    return o;
  };
  e.factory = [](std::vector<OptimizerParamGroup> groups, const std::vector<OptimizerSettings>&) {
    return build<Lion, LionOptions>(std::move(groups));
  };
  return e;
}

// ---- resolution ----------------------------------------------------------------

struct Props {
  int64_t ndim;
  std::vector<int64_t> shape;
  bool is_bias;
  bool is_embedding;
  bool is_head;
};

bool any_glob(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return glob_match(p, name); });
}

Props props_of(const std::string& name, const at::Tensor& p, const RoutingRules& routing) {
  const auto dot = name.rfind('.');
  const auto last = dot == std::string::npos ? name : name.substr(dot + 1);
  return {p.dim(), p.sizes().vec(), last.find("bias") != std::string::npos,
          any_glob(routing.embedding_patterns(), name), any_glob(routing.head_patterns(), name)};
}

bool matches(const ParamMatch& m, const std::regex* re, const std::string& name, const Props& p,
             const std::string& optimizer) {
  if (m.name && !glob_match(*m.name, name)) return false;
  if (re != nullptr && !std::regex_match(name, *re)) return false;
  if (m.ndim && p.ndim != *m.ndim) return false;
  if (m.max_ndim && p.ndim > *m.max_ndim) return false;
  if (m.shape && p.shape != *m.shape) return false;
  if (m.is_bias && p.is_bias != *m.is_bias) return false;
  if (m.is_embedding && p.is_embedding != *m.is_embedding) return false;
  if (m.is_head && p.is_head != *m.is_head) return false;
  if (m.optimizer && optimizer != *m.optimizer) return false;
  return true;
}

// The settings `entry` reads from a parameter's values: common fields, then
// the fields of uses_fields_of, then its own, prefixes stripped.
OptimizerSettings settings_for(const OptimizerRegistry& registry, const OptimizerEntry& entry,
                               const std::map<std::string, FieldValue>& values) {
  std::map<std::string, FieldValue> out;
  for (const auto& f : common_fields()) out[f.name] = values.at(f.name);
  auto strip = [&](const OptimizerEntry& e) {
    for (const auto& f : e.fields) out[f.name] = values.at(e.name + "_" + f.name);
  };
  for (const auto& other : entry.uses_fields_of) strip(*registry.at(other));
  strip(entry);
  return OptimizerSettings(std::move(out));
}

}  // namespace

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
  const auto& v = s.get(key);
  TORCH_CHECK_VALUE(type_of(v) == want, "[muon::OptimizerSettings] setting ", key, " is a ",
                    to_string(type_of(v)), ", not a ", to_string(want));
  return std::get<T>(v);
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
      FieldSpec::text("layout", "none",
                      "distributed layout (muon::dist::make_optimizer): none | tensor_parallel | "
                      "sharded | layerwise",
                      {"none", "tensor_parallel", "sharded", "layerwise"})
          .whole_run(),
      FieldSpec::text("layout_sharded_mode", "owner_compute",
                      "sharded layout: one owner orthogonalizes each matrix, or every rank all",
                      {"owner_compute", "replicated"})
          .whole_run(),
      FieldSpec::integer("layout_max_in_flight", 2,
                         "sharded and layerwise layouts: collectives in flight while computing "
                         "(0: no overlap)",
                         0.0)
          .whole_run(),
      FieldSpec::real("layout_bucket_mb", 8.0,
                      "layerwise layout: MB of updated parameters per all-gather bucket", 0.0)
          .exclusive_min()
          .whole_run(),
  };
}

OptimizerRegistry& OptimizerRegistry::global() {
  static OptimizerRegistry* registry = [] {
    auto* r = new OptimizerRegistry();  // never destroyed: usable from static destructors
    register_builtins(*r);
    return r;
  }();
  return *registry;
}

void OptimizerRegistry::register_builtins(OptimizerRegistry& registry) {
  registry.add(muon_entry());
  registry.add(adaptive_muon_entry());
  registry.add(adam_entry());  // before adamw, which reads its fields
  registry.add(adamw_entry());
  registry.add(sgd_entry());
  registry.add(lion_entry());
}

void OptimizerRegistry::add(OptimizerEntry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto& name = entry.name;
  TORCH_CHECK_VALUE(!name.empty(), kRegistry, "an optimizer needs a name");
  std::vector<std::string> names;
  for (const auto& e : entries_) names.push_back(e->name);
  TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), name) == names.end(), kRegistry,
                    "optimizer '", name, "' is already registered; registered: ", join(names));
  TORCH_CHECK_VALUE(entry.make_options != nullptr, kRegistry, "optimizer '", name,
                    "' has no make_options");
  TORCH_CHECK_VALUE(entry.factory != nullptr, kRegistry, "optimizer '", name, "' has no factory");
  for (const auto& other : entry.uses_fields_of) {
    TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), other) != names.end(), kRegistry,
                      "optimizer '", name, "' uses the fields of '", other,
                      "', which is not registered; registered: ", join(names));
  }
  // Config field names must stay unique across common and every entry's fields.
  std::vector<std::string> taken;
  for (const auto& f : common_fields()) taken.push_back(f.name);
  for (const auto& e : entries_) {
    for (const auto& f : e->fields) taken.push_back(e->name + "_" + f.name);
  }
  std::vector<std::string> mine;
  for (const auto& f : entry.fields) {
    TORCH_CHECK_VALUE(!f.name.empty(), kRegistry, "optimizer '", name, "' declares a field with no name");
    const auto full = name + "_" + f.name;
    TORCH_CHECK_VALUE(std::find(taken.begin(), taken.end(), full) == taken.end() &&
                          std::find(mine.begin(), mine.end(), full) == mine.end(),
                      kRegistry, "optimizer '", name, "' field '", f.name, "' makes config field '",
                      full, "', which already exists");
    f.check(f.default_value);  // the default must satisfy its own check
    mine.push_back(full);
  }
  // Default rules: every field they set must exist (common, an entry's, or
  // this one's), be per-parameter, and hold a valid value or a reference.
  std::map<std::string, FieldSpec> schema;
  for (const auto& f : common_fields()) schema[f.name] = f;
  auto prefixed = [](const std::string& prefix, FieldSpec f) {
    f.name = prefix + "_" + f.name;
    return f;
  };
  for (const auto& e : entries_) {
    for (const auto& f : e->fields) schema[e->name + "_" + f.name] = prefixed(e->name, f);
  }
  for (const auto& f : entry.fields) schema[name + "_" + f.name] = prefixed(name, f);
  for (const auto& rule : entry.default_overrides) {
    TORCH_CHECK_VALUE(!rule.set_fields.empty(), kRegistry, "optimizer '", name,
                      "' has a default override that sets nothing");
    for (const auto& [key, value] : rule.set_fields) {
      const auto it = schema.find(key);
      TORCH_CHECK_VALUE(it != schema.end(), kRegistry, "optimizer '", name, "' default override '",
                        rule.label, "' sets unknown field '", key, "'");
      TORCH_CHECK_VALUE(it->second.per_parameter, kRegistry, "optimizer '", name,
                        "' default override '", rule.label, "' sets whole-run field '", key, "'");
      const auto ref = reference_of(value);
      if (ref.empty()) {
        it->second.check(value);
      } else {
        TORCH_CHECK_VALUE(schema.count(ref) != 0 && schema.at(ref).type == it->second.type,
                          kRegistry, "optimizer '", name, "' default override '", rule.label,
                          "' sets ", key, " to ${", ref, "}, which is not a field of the same type");
      }
    }
  }
  entries_.push_back(std::make_shared<const OptimizerEntry>(std::move(entry)));
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
  const auto best = nearest_name(name, names);
  TORCH_CHECK_VALUE(false, kRegistry, "unknown optimizer '", name, "'",
                    best.empty() ? "" : "; did you mean '" + best + "'?",
                    " Registered: ", join(names));
}

std::vector<FieldSpec> OptimizerRegistry::fields() const {
  const auto names = keys();
  auto out = common_fields();
  for (auto& f : out) {
    if (f.name == "optimizer" || f.name == "scalar_optimizer") f.choices = names;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : entries_) {
    for (auto f : e->fields) {
      f.name = e->name + "_" + f.name;
      out.push_back(std::move(f));
    }
  }
  return out;
}

std::string OptimizerRegistry::help() const {
  std::ostringstream out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : entries_) out << "  " << std::left << std::setw(16) << e->name << e->doc << "\n";
  return out.str();
}

// ---- resolution, explain, make_optimizer ---------------------------------------

namespace {

std::vector<ResolvedParameter> resolve_rules(const torch::OrderedDict<std::string, at::Tensor>& named,
                                             const OptimizerConfig& config,
                                             const OptimizerRegistry& registry,
                                             bool allow_unmatched = false) {
  const auto& base = config.values();
  const auto main = registry.at(config.get_string("optimizer"));
  struct Rule {
    const OverrideRule* rule;
    std::unique_ptr<std::regex> re;
    bool user;
    size_t hits = 0;
  };
  std::vector<Rule> rules;
  for (const auto& r : main->default_overrides) rules.push_back({&r, nullptr, false});
  for (const auto& r : config.overrides()) rules.push_back({&r, nullptr, true});
  for (auto& r : rules) {
    if (r.rule->match.regex) r.re = std::make_unique<std::regex>(*r.rule->match.regex);
  }
  const RoutingRules routing;
  std::vector<ResolvedParameter> out;
  std::unordered_map<const c10::TensorImpl*, size_t> first;
  for (const auto& item : named) {
    ResolvedParameter r;
    r.name = item.key();
    r.shape = item.value().sizes().vec();
    const auto [it, fresh] = first.emplace(item.value().unsafeGetTensorImpl(), out.size());
    if (!fresh) {
      const auto& of = out[it->second];
      r.alias_of = of.name;
      r.optimizer = of.optimizer;
      r.values = of.values;
      out.push_back(std::move(r));
      continue;
    }
    r.values = base;
    const auto props = props_of(r.name, item.value(), routing);
    for (auto& rule : rules) {
      const auto& current = std::get<std::string>(r.values.at("optimizer"));
      if (!matches(rule.rule->match, rule.re.get(), r.name, props, current)) continue;
      ++rule.hits;
      r.rules.push_back(rule.rule->label);
      for (const auto& [key, value] : rule.rule->set_fields) {
        const auto ref = reference_of(value);
        r.values[key] = ref.empty() ? value : base.at(ref);
      }
    }
    r.optimizer = std::get<std::string>(r.values.at("optimizer"));
    TORCH_CHECK_VALUE(registry.has(r.optimizer), kMake, "parameter '", r.name,
                      "' resolves to optimizer '", r.optimizer, "', which is not registered; registered: ",
                      join(registry.keys()));
    out.push_back(std::move(r));
  }
  for (const auto& rule : rules) {
    TORCH_CHECK_VALUE(!rule.user || rule.hits > 0 || allow_unmatched, kMake, "override '", rule.rule->label, "' (",
                      rule.rule->match.describe(), ") matches no parameter");
  }
  return out;
}

// Parameters grouped by optimizer and identical settings; fills `group`.
struct Build {
  std::string optimizer;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<size_t> members;  // indices into resolved
  std::unique_ptr<OptimizerSettings> settings;
};

std::vector<Build> group_parameters(const torch::OrderedDict<std::string, at::Tensor>& named,
                                    std::vector<ResolvedParameter>& resolved,
                                    const OptimizerRegistry& registry) {
  std::vector<Build> builds;
  std::map<std::string, size_t> by_key;
  for (size_t i = 0; i < resolved.size(); ++i) {
    auto& r = resolved[i];
    if (!r.alias_of.empty()) continue;
    const auto entry = registry.at(r.optimizer);
    auto settings = settings_for(registry, *entry, r.values);
    std::string key = r.optimizer;
    for (const auto& [k, v] : settings.values()) key += "\n" + k + "=" + to_string(v);
    auto [it, fresh] = by_key.emplace(key, builds.size());
    if (fresh) {
      builds.push_back({r.optimizer, {}, {}, {}, std::make_unique<OptimizerSettings>(std::move(settings))});
    }
    auto& b = builds[it->second];
    b.params.push_back(named[i].value());
    b.names.push_back(r.name);
    b.members.push_back(i);
  }
  // Number the groups as the composite will: by optimizer in registry order.
  int64_t next = 0;
  for (const auto& name : registry.keys()) {
    for (auto& b : builds) {
      if (b.optimizer != name) continue;
      for (const auto m : b.members) resolved[m].group = next;
      ++next;
    }
  }
  return builds;
}

}  // namespace

std::vector<ResolvedParameter> resolve_parameters(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const OptimizerRegistry& registry) {
  auto resolved = resolve_rules(named, config, registry);
  group_parameters(named, resolved, registry);  // numbers the groups
  return resolved;
}

std::string explain(const torch::OrderedDict<std::string, at::Tensor>& named,
                    const OptimizerConfig& config, const OptimizerRegistry& registry) {
  auto resolved = resolve_rules(named, config, registry);
  group_parameters(named, resolved, registry);
  std::vector<std::array<std::string, 5>> rows;
  rows.push_back({"parameter", "shape", "optimizer", "group", "settings"});
  for (const auto& r : resolved) {
    std::string settings;
    if (!r.alias_of.empty()) {
      settings = "same tensor as '" + r.alias_of + "' (optimized once)";
    } else {
      const auto entry = registry.at(r.optimizer);
      const auto mine = settings_for(registry, *entry, r.values);
      const auto base = settings_for(registry, *entry, config.values());
      std::vector<std::string> parts;
      for (const auto& [k, v] : mine.values()) {
        const bool always = k == "lr" || k == "weight_decay";
        const auto spec_it = std::find_if(config.fields().begin(), config.fields().end(),
                                          [&](const FieldSpec& f) { return f.name == k; });
        const bool whole_run = spec_it != config.fields().end() && !spec_it->per_parameter;
        if (whole_run || k == "optimizer") continue;
        if (always || !(v == base.values().at(k))) parts.push_back(k + "=" + to_string(v));
      }
      settings = join(parts, " ");
      if (!r.rules.empty()) settings += "  [" + join(r.rules, "; ") + "]";
    }
    rows.push_back({r.name, to_string(FieldValue(r.shape)), r.optimizer,
                    r.group >= 0 ? std::to_string(r.group) : "-", settings});
  }
  std::array<size_t, 4> width{};
  for (const auto& row : rows) {
    for (size_t c = 0; c < 4; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  for (const auto& row : rows) {
    for (size_t c = 0; c < 4; ++c) out << std::left << std::setw(static_cast<int>(width[c] + 2)) << row[c];
    out << row[4] << "\n";
  }
  return out.str();
}

std::unique_ptr<CompositeOptimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const OptimizerRegistry& registry) {
  return make_optimizer(named, config, BuildContext(), registry);
}

std::unique_ptr<CompositeOptimizer> make_optimizer(
    const torch::OrderedDict<std::string, at::Tensor>& named, const OptimizerConfig& config,
    const BuildContext& context, const OptimizerRegistry& registry) {
  TORCH_CHECK_VALUE(!named.is_empty(), kMake, "no parameters given");
  for (const auto& item : context.factories) {
    TORCH_CHECK_VALUE(registry.has(item.first), kMake, "BuildContext replaces the factory of '",
                      item.first, "', which is not registered; registered: ", join(registry.keys()));
  }
  auto resolved = resolve_rules(named, config, registry, context.allow_unmatched_rules);
  auto builds = group_parameters(named, resolved, registry);
  std::vector<CompositePart> parts;
  for (const auto& name : registry.keys()) {
    const auto entry = registry.at(name);
    std::vector<OptimizerParamGroup> groups;
    std::vector<OptimizerSettings> settings;
    CompositePart part;
    part.name = name;
    const bool replaced = context.factories.count(name) != 0;
    for (const auto& b : builds) {
      if (b.optimizer != name) continue;
      try {
        // A tensor-parallel mode needs a layout that replaces the factory.
        TORCH_CHECK_VALUE(replaced || !b.settings->has("tp_mode") ||
                              b.settings->get_string("tp_mode") == "duplicated",
                          "muon_tp_mode '", b.settings->get_string("tp_mode"),
                          "' needs a tensor-parallel layout (layout tensor_parallel through "
                          "muon::dist::make_optimizer); single-process Muon is 'duplicated'");
        groups.emplace_back(b.params, entry->make_options(*b.settings));
      } catch (const c10::ValueError& e) {
        TORCH_CHECK_VALUE(false, kMake, "optimizer '", name, "' for parameters ", join(b.names),
                          ": ", e.what_without_backtrace());
      }
      settings.push_back(*b.settings);
      part.group_names.push_back(b.names);
    }
    if (groups.empty()) continue;
    try {
      part.optimizer = replaced ? context.factories.at(name)(std::move(groups), settings)
                                : entry->factory(std::move(groups), settings);
    } catch (const c10::ValueError& e) {
      TORCH_CHECK_VALUE(false, kMake, "optimizer '", name, "': ", e.what_without_backtrace());
    }
    TORCH_CHECK_VALUE(part.optimizer != nullptr, kMake, "the factory of '", name, "' returned null");
    if (entry->init_state) entry->init_state(*part.optimizer);
    part.state_bytes = entry->state_bytes;
    parts.push_back(std::move(part));
  }
  return std::make_unique<CompositeOptimizer>(std::move(parts));
}

LrScheduleOptions lr_schedule_options(const OptimizerConfig& config) {
  return LrScheduleOptions()
      .lr(config.get_double("lr"))
      .min_lr(config.get_double("min_lr"))
      .warmup_steps(config.get_int("lr_warmup_steps"))
      .warmup_init(config.get_double("lr_warmup_init"))
      .decay_steps(config.get_int("lr_decay_steps"))
      .style(config.get_string("lr_decay_style"));
}

}  // namespace muon
