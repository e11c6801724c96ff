// Declarations shared by the files of the optimizer config (config.cpp,
// config_json.cpp, config_flags.cpp) and the registry; not installed.
#pragma once

#include <c10/util/Exception.h>
#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "muon/config.h"

namespace re2 {
class RE2;
}

namespace muon::detail {

/// Prefix of the config's error messages.
constexpr const char* kConfigWho = "[muon::OptimizerConfig] ";

/// Deepest nesting of arrays and objects a JSON config may have; a config
/// needs four levels ({"overrides": [{"match": {"shape": [...]}}]}), and
/// bounding it keeps every recursive walk of a document (dump, copy)
/// shallow.
constexpr int kMaxJsonDepth = 64;
/// Longest name glob or regex an override rule may hold; parameter names
/// are far shorter.
constexpr std::size_t kMaxPatternLength = 1024;
/// Largest config file read.
constexpr std::size_t kMaxConfigFileBytes = std::size_t{64} << 20;

/// `text` parsed as JSON, at most kMaxJsonDepth deep. Every error of the
/// JSON layer (syntax, a number out of range, too deep) raises
/// c10::ValueError naming `what` (the document: "the config", "--override 1")
/// and the place in it ("overrides[2].lr").
nlohmann::json parse_json(const std::string& text, const std::string& what);

/// `pattern` compiled for matching whole parameter names with RE2 (linear
/// time in the name, bounded memory); raises c10::ValueError naming
/// `rule` (an override's label) when the pattern is too long or invalid.
std::shared_ptr<const re2::RE2> compile_regex(const std::string& pattern, const std::string& rule);

/// Whether `re` matches the whole of `name`.
bool regex_full_match(const re2::RE2& re, const std::string& name);

/// "; did you mean '<nearest>'?" or "" when `candidates` is empty.
std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates);

/// The shortest decimal form of `x` that reads back as `x` ("0.02").
std::string format_number(double x);

/// `value` as the T of type `want`; raises c10::ValueError
/// "<who><key> is a <its type>, not a <want>" when it holds another type
/// (who: "[muon::OptimizerConfig] field ").
template <typename T>
const T& typed_value(const FieldValue& value, FieldType want, const char* who,
                     const std::string& key) {
  TORCH_CHECK_VALUE(type_of(value) == want, who, key, " is a ", to_string(type_of(value)),
                    ", not a ", to_string(want));
  return std::get<T>(value);
}

/// "${field}" → "field"; empty when `value` is not such a reference.
std::string reference_of(const FieldValue& value);

/// A flag's text as a value of `spec`'s type ("0.9", "yes", "a,b", "[1, 2]"),
/// checked; raises c10::ValueError naming the field and the text.
FieldValue value_from_text(const FieldSpec& spec, const std::string& text);

/// A JSON value as a value of `field`'s type, checked; messages name the
/// place in the document, `where` ("overrides[0].set.lr").
FieldValue value_from_json(const FieldSpec& field, const nlohmann::json& j, const std::string& where);

/// An override rule from its JSON object; `where` names it in messages.
OverrideRule rule_from_json(const OptimizerConfig& config, const nlohmann::json& j,
                            const std::string& where);

}  // namespace muon::detail
