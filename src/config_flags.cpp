// The optimizer config from command-line flags (parsed with CLI11, used
// in this file only) and the flags' help text.
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "config_internal.h"
#include "muon/config.h"
#include "util/names.h"

namespace muon {

using detail::clip;
using detail::did_you_mean;
using detail::kConfigWho;
using json = nlohmann::json;

namespace detail {

FieldValue value_from_text(const FieldSpec& spec, const std::string& text) {
  auto fail = [&](const char* why = "") -> FieldValue {
    TORCH_CHECK_VALUE(false, kConfigWho, spec.name, " must be ", spec.requirement(), ", got '", clip(text),
                      "'", why);
  };
  const char* const kIntRange = ", past the range of a 64-bit int";
  // 0: not an int; -1: an int past the range of int64_t; 1: parsed.
  auto parse_int = [&](const std::string& t, int64_t& out) {
    if (t.empty()) return 0;
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(t.c_str(), &end, 10);
    if (end != t.c_str() + t.size()) return 0;
    if (errno == ERANGE) return -1;
    out = static_cast<int64_t>(x);
    return 1;
  };
  switch (spec.type) {
    case FieldType::kBool: {
      std::string t = text;
      std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
      if (t == "true" || t == "1" || t == "yes" || t == "on") return spec.check(true);
      if (t == "false" || t == "0" || t == "no" || t == "off") return spec.check(false);
      return fail();
    }
    case FieldType::kInt: {
      int64_t x = 0;
      const int parsed = parse_int(text, x);
      if (parsed <= 0) return fail(parsed < 0 ? kIntRange : "");
      return spec.check(x);
    }
    case FieldType::kDouble: {
      if (text.empty()) return fail();
      errno = 0;
      char* end = nullptr;
      const double x = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size()) return fail();
      // Underflow gives a denormal or zero, which is the number meant;
      // overflow gives ±HUGE_VAL, which is not.
      if (errno == ERANGE && std::isinf(x)) return fail(", past the range of a double");
      return spec.check(x);
    }
    case FieldType::kString:
      return spec.check(text);
    case FieldType::kStringList:
    case FieldType::kIntList: {
      if (!text.empty() && text.front() == '[') {
        return value_from_json(spec, parse_json(text, spec.name), spec.name);
      }
      std::vector<std::string> parts;
      if (!text.empty()) {
        std::stringstream ss(text);
        std::string item;
        while (std::getline(ss, item, ',')) parts.push_back(c10::str(item));
      }
      if (spec.type == FieldType::kStringList) return spec.check(parts);
      std::vector<int64_t> ints;
      for (const auto& p : parts) {
        int64_t x = 0;
        const int parsed = parse_int(p, x);
        if (parsed <= 0) return fail(parsed < 0 ? kIntRange : "");
        ints.push_back(x);
      }
      return spec.check(ints);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

}  // namespace detail

std::string config_help(const OptimizerConfig& config) {
  std::ostringstream out;
  out << "Optimizer flags (also JSON keys; '-' may replace '_'):\n";
  out << "  --config FILE          JSON config applied before the flags\n";
  out << "  --override JSON        append an override rule {\"match\": {...}, \"set\": {...}}\n";
  for (const auto& f : config.fields()) {
    out << "  --" << f.name << "  " << f.requirement() << ", default "
        << to_string(f.default_value) << (f.per_parameter ? "" : " (whole run)") << "\n      "
        << f.doc << "\n";
  }
  return out.str();
}

bool parse_config_flags(OptimizerConfig& config, const std::vector<std::string>& args) {
  CLI::App app{"optimizer config"};
  app.allow_extras();
  app.set_help_flag();
  bool help = false;
  app.add_flag("-h,--help", help, "print the flags");
  std::string config_file;
  app.add_option("--config", config_file, "JSON config file");
  std::vector<std::string> rules;
  app.add_option("--override", rules, "override rule as JSON")->allow_extra_args(false);
  std::vector<std::string> storage(config.fields().size());
  std::vector<CLI::Option*> options;
  std::vector<std::string> flag_names;
  std::vector<std::string> bool_flags;
  for (size_t i = 0; i < config.fields().size(); ++i) {
    const auto& field = config.fields()[i];
    std::string names = "--" + field.name;
    flag_names.push_back("--" + field.name);
    std::string dashed = field.name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (dashed != field.name) names += ",--" + dashed;
    if (field.type == FieldType::kBool) {
      // A bare bool flag means true; --flag=false and --flag false set it.
      options.push_back(app.add_flag(names + "{true}", storage[i], field.doc));
      bool_flags.push_back("--" + field.name);
      bool_flags.push_back("--" + dashed);
    } else {
      options.push_back(app.add_option(names, storage[i], field.doc));
    }
  }
  // "--flag false" → "--flag=false" for bool flags (CLI11 flags take values only after '=').
  std::vector<std::string> joined;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool is_bool_flag =
        std::find(bool_flags.begin(), bool_flags.end(), args[i]) != bool_flags.end();
    if (is_bool_flag && i + 1 < args.size()) {
      std::string next = args[i + 1];
      std::transform(next.begin(), next.end(), next.begin(), [](unsigned char c) { return std::tolower(c); });
      if (next == "true" || next == "false" || next == "1" || next == "0" || next == "yes" ||
          next == "no" || next == "on" || next == "off") {
        joined.push_back(args[i] + "=" + args[i + 1]);
        ++i;
        continue;
      }
    }
    joined.push_back(args[i]);
  }
  std::vector<const char*> argv{"muon"};
  for (const auto& a : joined) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    TORCH_CHECK_VALUE(false, kConfigWho, "bad flags: ", clip(e.what(), 200));
  }
  if (help) {
    std::cout << config_help(config);
    return false;
  }
  const auto extras = app.remaining();
  for (const auto& extra : extras) {
    if (extra.rfind("--", 0) == 0) {
      const auto flag = extra.substr(0, extra.find('='));
      TORCH_CHECK_VALUE(false, kConfigWho, "unknown flag '", clip(flag), "'", did_you_mean(flag, flag_names));
    }
    TORCH_CHECK_VALUE(false, kConfigWho, "unexpected argument '", clip(extra), "'");
  }
  OptimizerConfig updated = config;  // all or nothing
  if (!config_file.empty()) load_config_file(updated, config_file);
  for (size_t i = 0; i < options.size(); ++i) {
    if (options[i]->count() > 0) updated.set_from_string(config.fields()[i].name, storage[i]);
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    const auto where = "--override " + std::to_string(i + 1);
    const json j = detail::parse_json(rules[i], where + " '" + clip(rules[i], 40) + "'");
    updated.add_override(detail::rule_from_json(updated, j, where));
  }
  config = std::move(updated);
  return true;
}

bool parse_config_flags(OptimizerConfig& config, int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_config_flags(config, args);
}

}  // namespace muon
