#pragma once

/// One optimizer config for every registered optimizer, with per-parameter
/// overrides (the C++ form of Megatron-Core's single OptimizerConfig plus
/// config overrides).
///
/// A config is a set of typed fields described by a schema (`FieldSpec`):
/// the common fields (optimizer, lr, min_lr, weight_decay, the LR schedule,
/// scalar_optimizer), those of the registry's extensions (the distributed
/// layouts' `layout*`), and, for every optimizer in the registry
/// (muon/registry.h), its option fields named `<optimizer>_<option>`
/// (muon_momentum, lion_beta1, ...). The same names are the keys of the JSON
/// file and the command-line flags, generated from the schema, so an
/// optimizer registered by the user gets JSON keys and flags without code.
///
///     muon::OptimizerConfig config;                       // every field at its default
///     config.set("optimizer", "muon").set("lr", 0.02).set("muon_scale_mode", "shape_scaling");
///     config.add_override(muon::OverrideRule().match_name("*.qkv.weight").set("lr", 0.01));
///     muon::parse_config_flags(config, argc, argv);       // --lr 0.01 --muon_momentum 0.9 ...
///
/// Per-parameter overrides are ordered rules: each matches parameters by
/// name (glob or regex) and/or properties (ndim, shape, bias, embedding,
/// output head, the optimizer chosen so far) and sets fields for them. The
/// chosen optimizer's default rules (registry) apply first, then the user's
/// rules in order; later rules win. See docs/config.md.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace muon {

class OptimizerRegistry;

/// The value of a config field.
using FieldValue =
    std::variant<bool, int64_t, double, std::string, std::vector<std::string>, std::vector<int64_t>>;

/// The type of a config field.
enum class FieldType { kBool, kInt, kDouble, kString, kStringList, kIntList };

/// "bool" | "int" | "double" | "string" | "string list" | "int list".
std::string to_string(FieldType type);
/// The type a value holds.
FieldType type_of(const FieldValue& value);
/// A value as text: true, 3, 0.02, "muon" (quoted), ["a", "b"], [1, 2].
std::string to_string(const FieldValue& value);

/// One field of the schema: name, type, default, a doc line and a check.
struct FieldSpec {
  /// The field's name (an optimizer's option fields are declared without the
  /// `<optimizer>_` prefix; the registry adds it).
  std::string name;
  /// Its type.
  FieldType type = FieldType::kDouble;
  /// Its default (of `type`).
  FieldValue default_value = 0.0;
  /// One line of documentation (shown by --help and in docs).
  std::string doc;
  /// Allowed strings for a string field (empty: any).
  std::vector<std::string> choices;
  /// Inclusive or exclusive bounds of a numeric field (of each element of an int list).
  std::optional<double> min;
  /// See `min`.
  std::optional<double> max;
  /// Whether `min` itself is excluded.
  bool min_exclusive = false;
  /// Whether `max` itself is excluded.
  bool max_exclusive = false;
  /// Whether override rules may set it per parameter (false for the
  /// schedule and other whole-run settings).
  bool per_parameter = true;

  /// A bool field.
  static FieldSpec boolean(std::string name, bool def, std::string doc);
  /// An int field within [min, max].
  static FieldSpec integer(std::string name, int64_t def, std::string doc,
                           std::optional<double> min = std::nullopt,
                           std::optional<double> max = std::nullopt);
  /// A double field within the given bounds.
  static FieldSpec real(std::string name, double def, std::string doc,
                        std::optional<double> min = std::nullopt,
                        std::optional<double> max = std::nullopt);
  /// A string field, one of `choices` when not empty.
  static FieldSpec text(std::string name, std::string def, std::string doc,
                        std::vector<std::string> choices = {});
  /// An int-list field whose elements lie within [min, max].
  static FieldSpec int_list(std::string name, std::vector<int64_t> def, std::string doc,
                            std::optional<double> min = std::nullopt);
  /// A string-list field.
  static FieldSpec string_list(std::string name, std::vector<std::string> def, std::string doc);

  /// Excludes `min` (chained).
  FieldSpec& exclusive_min() { min_exclusive = true; return *this; }
  /// Excludes `max` (chained).
  FieldSpec& exclusive_max() { max_exclusive = true; return *this; }
  /// Marks the field as whole-run only (chained).
  FieldSpec& whole_run() { per_parameter = false; return *this; }

  /// `value` converted to this field's type (an int is accepted for a
  /// double) and checked; raises c10::ValueError naming the field and value.
  FieldValue check(const FieldValue& value) const;
  /// The requirement as text, e.g. "a double in [0, 1)"; for messages and help.
  std::string requirement() const;
};

/// Longest name nearest_name suggests a correction for.
constexpr std::size_t kMaxSuggestedNameLength = 64;

/// The name in `candidates` closest to `name` by edit distance, for "did you
/// mean" messages; empty when `candidates` is empty or `name` is longer than
/// kMaxSuggestedNameLength (no typo of a field is that long, and the search
/// costs its length times the candidates').
std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates);

/// Which parameters an override rule applies to. Every criterion given must
/// hold; a rule with no criterion matches every parameter.
struct ParamMatch {
  /// Glob over the dotted name (`*` any run, `?` one character); at most
  /// 1024 bytes.
  std::optional<std::string> name;
  /// Regular expression (RE2 syntax: matched in time linear in the name;
  /// no backreferences or lookaround) that must match the whole name; at
  /// most 1024 bytes.
  std::optional<std::string> regex;
  /// Exact number of dimensions.
  std::optional<int64_t> ndim;
  /// At most this many dimensions.
  std::optional<int64_t> max_ndim;
  /// Exact shape.
  std::optional<std::vector<int64_t>> shape;
  /// The last component of the name contains "bias".
  std::optional<bool> is_bias;
  /// The name matches an embedding pattern of muon::RoutingRules.
  std::optional<bool> is_embedding;
  /// The name matches an output-head pattern of muon::RoutingRules.
  std::optional<bool> is_head;
  /// The optimizer chosen by the rules before this one.
  std::optional<std::string> optimizer;

  /// The criteria as text, e.g. "name '*.bias', ndim 1".
  std::string describe() const;
};

/// An override rule: parameters matching `match` get the fields in `set`.
/// A string value "${field}" takes the config's value of that field (the
/// default Muon rules send parameters to "${scalar_optimizer}").
struct OverrideRule {
  /// Which parameters.
  ParamMatch match;
  /// Field → value, checked against the schema when the rule is added.
  std::map<std::string, FieldValue> set_fields;
  /// A label for explain() and messages (default: "rule <i>").
  std::string label;

  /// Chained setters for the criteria.
  OverrideRule& match_name(std::string glob) { match.name = std::move(glob); return *this; }
  /// See match_name.
  OverrideRule& match_regex(std::string re) { match.regex = std::move(re); return *this; }
  /// See match_name.
  OverrideRule& match_ndim(int64_t n) { match.ndim = n; return *this; }
  /// See match_name.
  OverrideRule& match_max_ndim(int64_t n) { match.max_ndim = n; return *this; }
  /// See match_name.
  OverrideRule& match_shape(std::vector<int64_t> s) { match.shape = std::move(s); return *this; }
  /// See match_name.
  OverrideRule& match_bias(bool b = true) { match.is_bias = b; return *this; }
  /// See match_name.
  OverrideRule& match_embedding(bool b = true) { match.is_embedding = b; return *this; }
  /// See match_name.
  OverrideRule& match_head(bool b = true) { match.is_head = b; return *this; }
  /// See match_name.
  OverrideRule& match_optimizer(std::string name) { match.optimizer = std::move(name); return *this; }
  /// Sets field `key` to `value` for matching parameters (chained).
  OverrideRule& set(const std::string& key, FieldValue value);
  /// Overloads so that literals pick the right alternative (0.1 a double, 1 an int, "x" a string).
  OverrideRule& set(const std::string& key, bool value) { return set(key, FieldValue(value)); }
  /// See above.
  OverrideRule& set(const std::string& key, int value) { return set(key, FieldValue(int64_t{value})); }
  /// See above.
  OverrideRule& set(const std::string& key, int64_t value) { return set(key, FieldValue(value)); }
  /// See above.
  OverrideRule& set(const std::string& key, double value) { return set(key, FieldValue(value)); }
  /// See above.
  OverrideRule& set(const std::string& key, const char* value) { return set(key, FieldValue(std::string(value))); }
  /// See above.
  OverrideRule& set(const std::string& key, std::string value) { return set(key, FieldValue(std::move(value))); }
  /// See above.
  OverrideRule& set(const std::string& key, std::vector<int64_t> value) { return set(key, FieldValue(std::move(value))); }
  /// See above.
  OverrideRule& set(const std::string& key, std::vector<std::string> value) { return set(key, FieldValue(std::move(value))); }
  /// Sets `label` (chained).
  OverrideRule& named(std::string l) { label = std::move(l); return *this; }
};

/// The optimizer config: every field of the schema with its value, plus the
/// user's override rules. Copyable value type.
class OptimizerConfig {
 public:
  /// Every field at its default; the schema is the global registry's (the
  /// common fields and the fields of the optimizers registered so far).
  /// Defined with the registry: the config itself knows only a schema.
  OptimizerConfig();
  /// The same with the fields of `registry` (OptimizerRegistry::fields()).
  explicit OptimizerConfig(const OptimizerRegistry& registry);
  /// Every field of `schema` at its default. Raises c10::ValueError for a
  /// field without a name or a name given twice.
  explicit OptimizerConfig(std::vector<FieldSpec> schema);

  /// Sets field `key`, checked against the schema: an unknown key raises
  /// c10::ValueError suggesting the nearest name; a wrong type or an
  /// out-of-range value raises it naming the key and the value. On error the
  /// config is unchanged.
  OptimizerConfig& set(const std::string& key, FieldValue value);
  /// Overloads so that literals pick the right alternative (0.1 a double, 1 an int, "x" a string).
  OptimizerConfig& set(const std::string& key, bool value) { return set(key, FieldValue(value)); }
  /// See above.
  OptimizerConfig& set(const std::string& key, int value) { return set(key, FieldValue(int64_t{value})); }
  /// See above.
  OptimizerConfig& set(const std::string& key, int64_t value) { return set(key, FieldValue(value)); }
  /// See above.
  OptimizerConfig& set(const std::string& key, double value) { return set(key, FieldValue(value)); }
  /// See above.
  OptimizerConfig& set(const std::string& key, const char* value) { return set(key, FieldValue(std::string(value))); }
  /// See above.
  OptimizerConfig& set(const std::string& key, std::string value) { return set(key, FieldValue(std::move(value))); }
  /// See above.
  OptimizerConfig& set(const std::string& key, std::vector<int64_t> value) { return set(key, FieldValue(std::move(value))); }
  /// See above.
  OptimizerConfig& set(const std::string& key, std::vector<std::string> value) { return set(key, FieldValue(std::move(value))); }
  /// Sets field `key` from text, as a flag value ("0.9", "true", "a,b", "[1, 2]").
  OptimizerConfig& set_from_string(const std::string& key, const std::string& text);

  /// The value of field `key` (unknown keys raise c10::ValueError with a suggestion).
  const FieldValue& get(const std::string& key) const;
  /// Typed accessors; raise c10::ValueError if the field has another type.
  bool get_bool(const std::string& key) const;
  /// See get_bool.
  int64_t get_int(const std::string& key) const;
  /// See get_bool.
  double get_double(const std::string& key) const;
  /// See get_bool.
  const std::string& get_string(const std::string& key) const;
  /// See get_bool.
  const std::vector<std::string>& get_string_list(const std::string& key) const;
  /// See get_bool.
  const std::vector<int64_t>& get_int_list(const std::string& key) const;

  /// Whether the schema has field `key`.
  bool has(const std::string& key) const;
  /// The schema of field `key`.
  const FieldSpec& spec(const std::string& key) const;
  /// The schema, in order: common fields, the extensions', then each optimizer's.
  const std::vector<FieldSpec>& fields() const { return *fields_; }
  /// Every value, by name.
  const std::map<std::string, FieldValue>& values() const { return values_; }

  /// Appends an override rule after checking its fields against the schema
  /// (same errors as set) and its regex; unlabeled rules get "rule <i>".
  OptimizerConfig& add_override(OverrideRule rule);
  /// The user's override rules, in order.
  const std::vector<OverrideRule>& overrides() const { return overrides_; }
  /// Removes every override rule.
  void clear_overrides() { overrides_.clear(); }

  /// A JSON document with every field and the override rules; reading it
  /// back gives an equal config.
  std::string to_json() const;

 private:
  std::shared_ptr<const std::vector<FieldSpec>> fields_;
  std::map<std::string, size_t> index_;
  std::map<std::string, FieldValue> values_;
  std::vector<OverrideRule> overrides_;
};

/// Applies a JSON document to `config`: an object whose keys are field
/// names, plus optional "overrides": [{"match": {...}, "set": {...},
/// "label": "..."}, ...] (match keys: name, regex, ndim, max_ndim, shape,
/// is_bias, is_embedding, is_head, optimizer). Unknown keys raise
/// c10::ValueError suggesting the nearest valid name; wrong types or values
/// name the key and the value. Every other error of the JSON layer (a
/// syntax error, a number out of range such as 1e400, nesting deeper than
/// 64) raises c10::ValueError naming the place ("overrides[2].set.lr");
/// messages echo at most a bounded prefix of any key or value. The config
/// is unchanged on error.
void apply_config_json(OptimizerConfig& config, const std::string& json_text);

/// Reads the JSON file at `path` into `config` (apply_config_json). A
/// missing or unreadable path, a directory, or a file over 64 MiB raises
/// c10::ValueError naming the path.
void load_config_file(OptimizerConfig& config, const std::string& path);

/// Applies command-line flags to `config`, parsed with CLI11: one flag per
/// field, `--<field> <value>` or `--<field>=<value>` (dashes accepted for
/// underscores: `--muon-momentum`); `--config <file.json>` is applied first
/// and flags override it; `--override '<json rule>'` (repeatable) appends a
/// rule. Lists are comma-separated ("1,2,3") or JSON ("[1, 2, 3]"); bools
/// take true/false/1/0/yes/no/on/off, and a bare bool flag means true. An unknown flag raises c10::ValueError
/// suggesting the nearest valid one. `args` excludes the program name.
/// Returns false (having printed help to stdout) when --help was given.
bool parse_config_flags(OptimizerConfig& config, const std::vector<std::string>& args);
/// The same over main's argc/argv (argv[0] is skipped).
bool parse_config_flags(OptimizerConfig& config, int argc, const char* const* argv);

/// The help text of the flags: one line per field with type, default and doc.
std::string config_help(const OptimizerConfig& config);

}  // namespace muon
