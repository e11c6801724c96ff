// The optimizer config as JSON: reading documents and files into a config
// (all or nothing) and writing one back.
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sys/stat.h>

#include "config_internal.h"
#include "muon/config.h"
#include "util/names.h"

namespace muon {

using detail::clip;
using detail::did_you_mean;
using detail::join;
using detail::kConfigWho;
using detail::kMaxConfigFileBytes;
using detail::reference_of;
using detail::rule_from_json;
using detail::value_from_json;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kMatchKeys = {"name",  "regex",    "ndim",         "max_ndim",
                                             "shape", "is_bias",  "is_embedding", "is_head",
                                             "optimizer"};
const std::vector<std::string> kRuleKeys = {"match", "set", "label"};

json to_json_value(const FieldValue& v) {
  return std::visit([](const auto& x) { return json(x); }, v);
}

/// `j` as text for a message: bounded, and never failing on bytes that are
/// not UTF-8.
std::string show(const json& j) {
  return clip(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

/// Runs `f`; an exception of the JSON layer it raises becomes c10::ValueError
/// naming `where`.
template <typename F>
void guarded(const std::string& where, F&& f) {
  try {
    f();
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, kConfigWho, clip(where), ": ", clip(e.what(), 200));
  }
}

/// A JSON integer as int64_t; false for non-integers and for unsigned values
/// past INT64_MAX (which get<int64_t> would wrap to negative numbers).
bool as_int64(const json& j, int64_t& out) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (!j.is_number_integer()) return false;
  out = j.get<int64_t>();
  return true;
}

/// Where a parse is in the document: one frame per open array or object.
struct JsonPath {
  struct Frame {
    bool array = false;
    std::string key;    // objects: the last key read
    size_t items = 0;   // arrays: elements completed
  };
  std::vector<Frame> frames;

  std::string str() const {
    std::string out;
    for (const auto& f : frames) {
      if (f.array) {
        out += "[" + std::to_string(f.items) + "]";
      } else if (!f.key.empty()) {
        out += (out.empty() ? "" : ".") + clip(f.key, 40);
      }
    }
    return clip(out, 200);
  }
  void item_done() {
    if (!frames.empty() && frames.back().array) ++frames.back().items;
  }
};

json match_to_json(const ParamMatch& m) {
  json j = json::object();
  if (m.name) j["name"] = *m.name;
  if (m.regex) j["regex"] = *m.regex;
  if (m.ndim) j["ndim"] = *m.ndim;
  if (m.max_ndim) j["max_ndim"] = *m.max_ndim;
  if (m.shape) j["shape"] = *m.shape;
  if (m.is_bias) j["is_bias"] = *m.is_bias;
  if (m.is_embedding) j["is_embedding"] = *m.is_embedding;
  if (m.is_head) j["is_head"] = *m.is_head;
  if (m.optimizer) j["optimizer"] = *m.optimizer;
  return j;
}

}  // namespace

namespace detail {

json parse_json(const std::string& text, const std::string& what) {
  JsonPath path;
  // The parser itself iterates, but dump() and copies recurse: the callback
  // stops a document deeper than kMaxJsonDepth as it is read.
  const json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        TORCH_CHECK_VALUE(depth < kMaxJsonDepth, kConfigWho, clip(what), ": nesting deeper than ",
                          kMaxJsonDepth, " at ", path.str().empty() ? "the top" : path.str());
        path.frames.push_back({event == json::parse_event_t::array_start, {}, 0});
        break;
      case json::parse_event_t::key:
        if (!path.frames.empty()) path.frames.back().key = parsed.get<std::string>();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!path.frames.empty()) path.frames.pop_back();
        path.item_done();
        break;
      case json::parse_event_t::value:
        path.item_done();
        break;
    }
    return true;
  };
  try {
    return json::parse(text, callback);
  } catch (const json::exception& e) {
    const auto at = path.str();
    TORCH_CHECK_VALUE(false, kConfigWho, clip(what), " is not valid JSON", at.empty() ? "" : " at " + at, ": ",
                      clip(e.what(), 200));
  }
}

FieldValue value_from_json(const FieldSpec& field, const json& j, const std::string& where) {
  FieldSpec spec = field;
  spec.name = where;  // messages name the place in the document ("overrides[0].set.lr")
  auto fail = [&]() -> FieldValue {
    TORCH_CHECK_VALUE(false, kConfigWho, clip(where), " must be ", spec.requirement(), ", got ", show(j));
  };
  int64_t x = 0;
  switch (spec.type) {
    case FieldType::kBool:
      if (!j.is_boolean()) return fail();
      return spec.check(j.get<bool>());
    case FieldType::kInt:
      if (j.is_number_unsigned() && !as_int64(j, x)) {
        TORCH_CHECK_VALUE(false, kConfigWho, clip(where), " must be ", spec.requirement(), ", got ", show(j),
                          ", past the largest 64-bit int");
      }
      if (!as_int64(j, x)) return fail();
      return spec.check(x);
    case FieldType::kDouble:
      if (!j.is_number()) return fail();
      return spec.check(j.get<double>());
    case FieldType::kString:
      if (!j.is_string()) return fail();
      return spec.check(j.get<std::string>());
    case FieldType::kStringList: {
      if (!j.is_array()) return fail();
      std::vector<std::string> out;
      for (const auto& e : j) {
        if (!e.is_string()) return fail();
        out.push_back(e.get<std::string>());
      }
      return spec.check(out);
    }
    case FieldType::kIntList: {
      if (!j.is_array()) return fail();
      std::vector<int64_t> out;
      for (const auto& e : j) {
        if (!as_int64(e, x)) return fail();
        out.push_back(x);
      }
      return spec.check(out);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

OverrideRule rule_from_json(const OptimizerConfig& config, const json& j, const std::string& where) {
  TORCH_CHECK_VALUE(j.is_object(), kConfigWho, where, " must be an object with \"match\" and \"set\", got ",
                    show(j));
  OverrideRule rule;
  for (const auto& [key, value] : j.items()) {
    TORCH_CHECK_VALUE(std::find(kRuleKeys.begin(), kRuleKeys.end(), key) != kRuleKeys.end(), kConfigWho,
                      "unknown key '", clip(key), "' in ", where, did_you_mean(key, kRuleKeys),
                      " (valid: ", join(kRuleKeys), ")");
  }
  if (j.contains("label")) {
    TORCH_CHECK_VALUE(j["label"].is_string(), kConfigWho, where, ".label must be a string, got ",
                      show(j["label"]));
    rule.label = j["label"].get<std::string>();
  }
  if (j.contains("match")) {
    const auto& m = j["match"];
    TORCH_CHECK_VALUE(m.is_object(), kConfigWho, where, ".match must be an object, got ", show(m));
    for (const auto& [key, v] : m.items()) {
      const std::string at = where + ".match." + clip(key);
      auto need = [&](bool ok, const char* what) {
        TORCH_CHECK_VALUE(ok, kConfigWho, at, " must be ", what, ", got ", show(v));
      };
      int64_t n = 0;
      if (key == "name") {
        need(v.is_string(), "a string (glob)");
        rule.match.name = v.get<std::string>();
      } else if (key == "regex") {
        need(v.is_string(), "a string (regex)");
        rule.match.regex = v.get<std::string>();
      } else if (key == "ndim" || key == "max_ndim") {
        need(as_int64(v, n) && n >= 0, "an int >= 0");
        (key == "ndim" ? rule.match.ndim : rule.match.max_ndim) = n;
      } else if (key == "shape") {
        need(v.is_array() && std::all_of(v.begin(), v.end(),
                                         [&](const json& e) { return as_int64(e, n); }),
             "a list of ints");
        std::vector<int64_t> shape;
        for (const auto& e : v) shape.push_back(as_int64(e, n) ? n : 0);
        rule.match.shape = std::move(shape);
      } else if (key == "is_bias" || key == "is_embedding" || key == "is_head") {
        need(v.is_boolean(), "a bool");
        (key == "is_bias" ? rule.match.is_bias
                          : key == "is_embedding" ? rule.match.is_embedding : rule.match.is_head) =
            v.get<bool>();
      } else if (key == "optimizer") {
        need(v.is_string(), "a string");
        rule.match.optimizer = v.get<std::string>();
      } else {
        TORCH_CHECK_VALUE(false, kConfigWho, "unknown key '", clip(key), "' in ", where, ".match",
                          did_you_mean(key, kMatchKeys), " (valid: ", join(kMatchKeys), ")");
      }
    }
  }
  TORCH_CHECK_VALUE(j.contains("set") && j["set"].is_object(), kConfigWho, where,
                    " needs \"set\": an object of field → value");
  std::vector<std::string> names;
  for (const auto& f : config.fields()) names.push_back(f.name);
  for (const auto& [key, v] : j["set"].items()) {
    TORCH_CHECK_VALUE(config.has(key), kConfigWho, "unknown key '", clip(key), "' in ", where, ".set",
                      did_you_mean(key, names));
    const auto& spec = config.spec(key);
    if (v.is_string() && !reference_of(FieldValue(v.get<std::string>())).empty()) {
      rule.set_fields[key] = v.get<std::string>();  // a "${field}" reference, checked by add_override
    } else {
      rule.set_fields[key] = value_from_json(spec, v, where + ".set." + key);
    }
  }
  return rule;
}

}  // namespace detail

namespace {

json rule_to_json(const OverrideRule& rule) {
  json j;
  j["match"] = match_to_json(rule.match);
  json set = json::object();
  for (const auto& [k, v] : rule.set_fields) set[k] = to_json_value(v);
  j["set"] = set;
  if (!rule.label.empty()) j["label"] = rule.label;
  return j;
}

void apply_json_object(OptimizerConfig& config, const json& doc) {
  TORCH_CHECK_VALUE(doc.is_object(), kConfigWho, "the config document must be a JSON object, got ",
                    show(doc));
  std::vector<std::string> keys;
  for (const auto& f : config.fields()) keys.push_back(f.name);
  keys.push_back("overrides");
  for (const auto& [key, value] : doc.items()) {
    if (key == "overrides") continue;
    TORCH_CHECK_VALUE(config.has(key), kConfigWho, "unknown key '", clip(key), "'", did_you_mean(key, keys));
    guarded(key, [&] { config.set(key, value_from_json(config.spec(key), value, key)); });
  }
  if (doc.contains("overrides")) {
    const auto& rules = doc["overrides"];
    TORCH_CHECK_VALUE(rules.is_array(), kConfigWho, "overrides must be a list of rules, got ", show(rules));
    for (size_t i = 0; i < rules.size(); ++i) {
      const auto where = "overrides[" + std::to_string(i) + "]";
      guarded(where, [&] { config.add_override(rule_from_json(config, rules[i], where)); });
    }
  }
}

}  // namespace

std::string OptimizerConfig::to_json() const {
  json j = json::object();
  for (const auto& f : *fields_) j[f.name] = to_json_value(values_.at(f.name));
  json rules = json::array();
  for (const auto& r : overrides_) rules.push_back(rule_to_json(r));
  j["overrides"] = rules;
  try {
    return j.dump(2);
  } catch (const json::exception& e) {
    // Strings set from C++ need not be UTF-8; JSON text must be. Name the
    // first field that is not.
    for (const auto& f : *fields_) {
      guarded(f.name, [&] { to_json_value(values_.at(f.name)).dump(); });
    }
    TORCH_CHECK_VALUE(false, kConfigWho, "the override rules cannot be written as JSON: ", clip(e.what(), 200));
  }
}

void apply_config_json(OptimizerConfig& config, const std::string& json_text) {
  const json doc = detail::parse_json(json_text, "the config");
  OptimizerConfig updated = config;  // all or nothing
  apply_json_object(updated, doc);
  config = std::move(updated);
}

void load_config_file(OptimizerConfig& config, const std::string& path) {
  const auto shown = clip(path, 256);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    TORCH_CHECK_VALUE(false, kConfigWho, "cannot open config file '", shown, "': ", std::strerror(err));
  }
  TORCH_CHECK_VALUE(!S_ISDIR(st.st_mode), kConfigWho, "'", shown, "' is a directory, not a JSON config file");
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    const int err = errno;
    TORCH_CHECK_VALUE(false, kConfigWho, "cannot open config file '", shown, "': ", std::strerror(err));
  }
  // Read in chunks up to the limit: a pipe or a device may never end.
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof(chunk)) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    TORCH_CHECK_VALUE(text.size() <= kMaxConfigFileBytes, kConfigWho, "config file '", shown,
                      "' is larger than ", kMaxConfigFileBytes >> 20, " MiB");
  }
  TORCH_CHECK_VALUE(!in.bad(), kConfigWho, "cannot read config file '", shown, "'");
  try {
    apply_config_json(config, text);
  } catch (const c10::ValueError& e) {
    std::string inner = e.what_without_backtrace();
    if (inner.rfind(kConfigWho, 0) == 0) inner.erase(0, std::strlen(kConfigWho));
    TORCH_CHECK_VALUE(false, kConfigWho, "in config file '", shown, "': ", inner);
  }
}

}  // namespace muon
