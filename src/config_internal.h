// Declarations shared by the files of the optimizer config (config.cpp,
// config_json.cpp, config_flags.cpp) and the registry; not installed.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

#include "muon/config.h"

namespace muon::detail {

/// Prefix of the config's error messages.
constexpr const char* kConfigWho = "[muon::OptimizerConfig] ";

/// "; did you mean '<nearest>'?" or "" when `candidates` is empty.
std::string did_you_mean(const std::string& name, const std::vector<std::string>& candidates);

/// The shortest decimal form of `x` that reads back as `x` ("0.02").
std::string format_number(double x);

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
