// The config layer under hostile or careless input: every input error (JSON
// text and files, command-line flags, OptimizerConfig::set, override
// patterns) is a c10::ValueError of bounded length naming the key; numbers
// out of range, deep documents and pathological patterns end in such an
// error or run in bounded time, never in an abort, a crash or a hang.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "expect_util.h"
#include "muon/config.h"
#include "muon/registry.h"
#include "util/names.h"

namespace muon::test {
namespace {

using muon::OptimizerConfig;
using muon::OverrideRule;

// Error messages echo at most a prefix of any input: far below this however
// long the input is.
constexpr size_t kMaxMessage = 1024;
// 10 MB: the size of the inputs that made 10 MB messages and 25 s searches.
constexpr size_t kHuge = size_t{10} << 20;

// The message of the c10::ValueError `f` raises ("" and a failure if none).
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "no c10::ValueError";
  return {};
}

// Expects a bounded ValueError containing every one of `parts`.
void expect_bounded_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const auto msg = message_of(f);
  EXPECT_LT(msg.size(), kMaxMessage) << msg.substr(0, 300);
  for (const auto& part : parts) {
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg.substr(0, 300);
  }
}

std::function<void()> apply_json(OptimizerConfig& c, const std::string& text) {
  return [&c, text] { muon::apply_config_json(c, text); };
}

std::function<void()> parse_flags(OptimizerConfig& c, const std::vector<std::string>& args) {
  return [&c, args] { muon::parse_config_flags(c, args); };
}

std::string nested(size_t depth, const std::string& open, const std::string& inner, const std::string& close) {
  std::string out;
  out.reserve(depth * (open.size() + close.size()) + inner.size());
  for (size_t i = 0; i < depth; ++i) out += open;
  out += inner;
  for (size_t i = 0; i < depth; ++i) out += close;
  return out;
}

// ---- numbers the JSON layer cannot hold -------------------------------------------

TEST(ConfigInputs, JsonNumbersOutOfRangeNameTheKey) {
  OptimizerConfig c;
  expect_value_error(apply_json(c, R"({"lr": 1e400})"), {"[muon::OptimizerConfig]", "at lr", "1e400"});
  expect_value_error(apply_json(c, R"({"overrides": [{"set": {"lr": 0.1}}, {"set": {"lr": 0.1}},
                                                     {"set": {"lr": -1e999}}]})"),
                     {"at overrides[2].set.lr", "1e999"});
  // Past INT64_MAX: nlohmann reads it as unsigned, and get<int64_t> would
  // wrap it to a negative number.
  expect_value_error(apply_json(c, R"({"lr_warmup_steps": 9223372036854775808})"),
                     {"lr_warmup_steps", "9223372036854775808", "64-bit"});
  expect_value_error(apply_json(c, R"({"muon_qkv_split_sizes": [1, 18446744073709551615]})"),
                     {"muon_qkv_split_sizes", "18446744073709551615"});
  expect_value_error(apply_json(c, R"({"overrides": [{"match": {"ndim": 18446744073709551615}, "set": {"lr": 1}}]})"),
                     {"overrides[0].match.ndim", "18446744073709551615"});
  EXPECT_EQ(c.values(), OptimizerConfig().values());  // nothing applied
  EXPECT_TRUE(c.overrides().empty());
}

TEST(ConfigInputs, FlagNumbersOutOfRangeNotNumbersAndNonFinite) {
  OptimizerConfig c;
  expect_bounded_error(parse_flags(c, {"--lr", "1e400"}), {"lr", "'1e400'", "range of a double"});
  expect_bounded_error(parse_flags(c, {"--lr", "inf"}), {"lr must be a double in [0, inf)", "inf"});
  expect_bounded_error(parse_flags(c, {"--lr", "nan"}), {"lr must be a double", "nan"});
  expect_bounded_error(parse_flags(c, {"--lr", "-0.5"}), {"lr must be a double in [0, inf)", "-0.5"});
  expect_bounded_error(parse_flags(c, {"--lr", "0x"}), {"lr", "'0x'"});
  expect_bounded_error(parse_flags(c, {"--lr_warmup_steps", "9223372036854775808"}),
                       {"lr_warmup_steps", "9223372036854775808", "64-bit int"});
  expect_bounded_error(parse_flags(c, {"--lr_warmup_steps", "-3"}), {"lr_warmup_steps", "-3"});
  expect_bounded_error(parse_flags(c, {"--lr_warmup_steps", "2.5"}), {"lr_warmup_steps must be an int", "'2.5'"});
  expect_bounded_error(parse_flags(c, {"--muon_qkv_split_sizes", "1,99999999999999999999"}),
                       {"muon_qkv_split_sizes", "64-bit int"});
  expect_bounded_error(parse_flags(c, {"--muon_qkv_split_sizes", "[1, 1e400]"}),
                       {"muon_qkv_split_sizes", "not valid JSON"});
  expect_bounded_error(parse_flags(c, {"--lr"}), {"bad flags", "lr"});
  EXPECT_EQ(c.values(), OptimizerConfig().values());
  // Underflow is the number meant (a denormal), not an error.
  ASSERT_TRUE(muon::parse_config_flags(c, {"--lr", "1e-320"}));
  EXPECT_GT(c.get_double("lr"), 0.0);
  EXPECT_LT(c.get_double("lr"), 1e-300);
}

// ---- depth ------------------------------------------------------------------------

TEST(ConfigInputs, DeepJsonIsRefusedNotACrash) {
  OptimizerConfig c;
  const auto deep = nested(100000, "[", "1", "]");
  expect_bounded_error(apply_json(c, R"({"lr": )" + deep + "}"), {"nesting deeper than 64", "at lr"});
  expect_bounded_error(apply_json(c, deep), {"nesting deeper than 64", "at [0][0][0]"});
  expect_bounded_error(apply_json(c, R"({"overrides": [{"match": {"shape": )" + deep + "}}]}"),
                       {"nesting deeper than 64", "overrides[0].match.shape"});
  expect_bounded_error(apply_json(c, nested(100000, R"({"a": )", "1", "}")), {"nesting deeper than 64"});
  expect_bounded_error(parse_flags(c, {"--override", deep}), {"--override 1", "nesting deeper than 64"});
  expect_bounded_error(parse_flags(c, {"--muon_qkv_split_sizes", deep}),
                       {"muon_qkv_split_sizes", "nesting deeper than 64"});
  // Shallow nesting is read, and refused as a wrong type.
  expect_bounded_error(apply_json(c, R"({"lr": )" + nested(60, "[", "1", "]") + "}"), {"lr must be a double"});
  EXPECT_EQ(c.values(), OptimizerConfig().values());
}

// ---- regex patterns ----------------------------------------------------------------

torch::OrderedDict<std::string, at::Tensor> params(const std::vector<std::string>& names) {
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& n : names) out.insert(n, torch::zeros({4, 4}));
  return out;
}

TEST(ConfigInputs, RegexRunsInLinearTime) {
  // Backtracking engines take exponential time to fail this pattern on a
  // long name; RE2 takes time linear in the name.
  const std::string long_name(200, 'a');
  OptimizerConfig c;
  c.add_override(OverrideRule().match_regex("(.*)*(.*)*(.*)*(.*)*(.*)*x").set("lr", 0.01).named("star"));
  const auto resolved = muon::resolve_parameters(params({long_name, "layers.0.x"}), c);
  ASSERT_EQ(resolved.size(), 2u);
  EXPECT_TRUE(resolved[0].rules.empty());
  EXPECT_DOUBLE_EQ(std::get<double>(resolved[0].values.at("lr")), c.get_double("lr"));
  EXPECT_EQ(resolved[1].rules, std::vector<std::string>{"star"});
  EXPECT_DOUBLE_EQ(std::get<double>(resolved[1].values.at("lr")), 0.01);

  // Full-match semantics, as before.
  OptimizerConfig d;
  d.add_override(OverrideRule().match_regex("qkv\\.weight").set("lr", 0.01).named("part"));
  expect_value_error([&] { muon::resolve_parameters(params({"layers.0.qkv.weight"}), d); },
                     {"override 'part'", "matches no parameter"});

  // Deep nesting within the length limit is fine for RE2 (no recursion).
  OptimizerConfig e;
  e.add_override(OverrideRule().match_regex(nested(500, "(", "w", ")")).set("lr", 0.01).named("deep"));
  EXPECT_EQ(muon::resolve_parameters(params({"w"}), e)[0].rules, std::vector<std::string>{"deep"});
}

TEST(ConfigInputs, BadRegexNamesTheOverride) {
  OptimizerConfig c;
  // 20,000 nested parentheses overflowed std::regex's recursive parser.
  expect_bounded_error([&] { c.add_override(OverrideRule().match_regex(nested(20000, "(", "a", ")")).set("lr", 0.1).named("deep")); },
                       {"override 'deep'", "regex of 40001 bytes", "longer than 1024"});
  expect_bounded_error([&] { c.add_override(OverrideRule().match_regex("(a)\\1").set("lr", 0.1).named("backref")); },
                       {"override 'backref'", "invalid regex '(a)\\1'", "RE2"});
  expect_bounded_error(apply_json(c, R"({"overrides": [{"label": "mine", "match": {"regex": "(x"}, "set": {"lr": 0.1}}]})"),
                       {"override 'mine'", "invalid regex '(x'"});
  expect_bounded_error([&] { c.add_override(OverrideRule().match_name(std::string(2000, '*')).set("lr", 0.1).named("glob")); },
                       {"override 'glob'", "name glob of 2000 bytes"});
  EXPECT_TRUE(c.overrides().empty());
}

// ---- huge keys, values, names, patterns, labels ------------------------------------

TEST(ConfigInputs, NoSuggestionForAHugeName) {
  const std::vector<std::string> names{"lr", "muon_momentum"};
  EXPECT_EQ(muon::nearest_name("muon_momentun", names), "muon_momentum");
  EXPECT_EQ(muon::nearest_name(std::string(muon::kMaxSuggestedNameLength, 'l'), names), "lr");
  EXPECT_EQ(muon::nearest_name(std::string(muon::kMaxSuggestedNameLength + 1, 'l'), names), "");
}

TEST(ConfigInputs, HugeInputsGiveShortMessagesNamingTheKey) {
  const std::string big(kHuge, 'q');
  const std::string head = big.substr(0, 40);
  OptimizerConfig c;
  // Unknown keys: clipped, and no did-you-mean search over 10 MB.
  const auto unknown = message_of(apply_json(c, "{\"" + big + "\": 1}"));
  EXPECT_LT(unknown.size(), kMaxMessage);
  EXPECT_NE(unknown.find("unknown key '" + head), std::string::npos);
  EXPECT_NE(unknown.find(std::to_string(kHuge) + " bytes"), std::string::npos);
  EXPECT_EQ(unknown.find("did you mean"), std::string::npos);
  expect_bounded_error([&] { c.set(big, 1.0); }, {"unknown field '" + head});
  expect_bounded_error(apply_json(c, R"({"overrides": [{"set": {")" + big + "\": 1}}]}"),
                       {"unknown key '" + head, "overrides[0].set"});
  expect_bounded_error(apply_json(c, R"({"overrides": [{"match": {")" + big + "\": 1}, \"set\": {\"lr\": 1}}]}"),
                       {"unknown key '" + head, "overrides[0].match"});
  // Values of the wrong type or out of range.
  expect_bounded_error(apply_json(c, "{\"lr\": \"" + big + "\"}"), {"lr must be a double", head});
  expect_bounded_error(apply_json(c, "{\"optimizer\": \"" + big + "\"}"), {"optimizer must be one of", head});
  expect_bounded_error([&] { c.set("optimizer", big); }, {"optimizer must be one of", head});
  expect_bounded_error([&] { c.set("lr", big); }, {"lr must be a double", head});
  std::string list = "[";
  for (int i = 0; i < 1000000; ++i) list += "-1,";
  list += "-1]";
  expect_bounded_error(apply_json(c, "{\"muon_qkv_split_sizes\": " + list + "}"),
                       {"muon_qkv_split_sizes", "[-1, -1"});
  expect_bounded_error(apply_json(c, "{\"overrides\": [{\"match\": {\"ndim\": \"" + big + "\"}, \"set\": {\"lr\": 1}}]}"),
                       {"overrides[0].match.ndim", head});
  // Registered names, patterns and labels.
  expect_bounded_error([&] { muon::OptimizerRegistry::global().at(big); }, {"unknown optimizer '" + head});
  expect_bounded_error([&] { c.add_override(OverrideRule().match_regex(big).set("lr", 0.1).named("r")); },
                       {"override 'r'", "regex of " + std::to_string(kHuge) + " bytes", head});
  expect_bounded_error([&] { c.add_override(OverrideRule().match_regex("(" + big).set("lr", 0.1).named(big)); },
                       {"override '" + head});
  expect_bounded_error([&] { c.add_override(OverrideRule().named(big)); }, {"override '" + head, "sets no field"});
  OptimizerConfig d;
  d.add_override(OverrideRule().match_name("nothing").set("lr", 0.1).named(big));
  expect_bounded_error([&] { muon::resolve_parameters(params({"w"}), d); }, {"override '" + head, "matches no parameter"});
  // Flags.
  expect_bounded_error(parse_flags(c, {"--" + big, "1"}), {"unknown flag '--" + head.substr(2)});
  expect_bounded_error(parse_flags(c, {"--lr", big}), {"lr must be a double", head});
  expect_bounded_error(parse_flags(c, {"--lr_warmup_steps", std::string(kHuge, '9')}),
                       {"lr_warmup_steps", "64-bit int"});
  expect_bounded_error(parse_flags(c, {"--optimizer", big}), {"optimizer must be one of", head});
  expect_bounded_error(parse_flags(c, {"--override", big}), {"--override 1", "not valid JSON"});
  expect_bounded_error(parse_flags(c, {big}), {"unexpected argument '" + head});
  expect_bounded_error(parse_flags(c, {"--muon_qkv_split_sizes", list}), {"muon_qkv_split_sizes"});
  EXPECT_EQ(c.values(), OptimizerConfig().values());
  EXPECT_TRUE(c.overrides().empty());
}

TEST(ConfigInputs, ClipKeepsShortTextAndUtf8Whole) {
  EXPECT_EQ(muon::detail::clip("short"), "short");
  EXPECT_EQ(muon::detail::clip(std::string(80, 'x')), std::string(80, 'x'));
  EXPECT_EQ(muon::detail::clip(std::string(81, 'x')), std::string(80, 'x') + "\u2026 (81 bytes)");
  // "é" is two bytes: a cut after byte 3 of "aaé…" would split it.
  EXPECT_EQ(muon::detail::clip("aa\u00e9\u00e9", 3), "aa\u2026 (6 bytes)");
}

TEST(ConfigInputs, InvalidUtf8IsAnErrorWhenWritingJson) {
  OptimizerConfig c;
  c.add_override(OverrideRule().match_name("*").set("lr", 0.1).named("bad \xff label"));
  expect_bounded_error([&] { c.to_json(); }, {"cannot be written as JSON", "UTF-8"});
}

// ---- config files --------------------------------------------------------------------

TEST(ConfigInputs, ConfigFilePathsThatAreNotFiles) {
  OptimizerConfig c;
  const auto dir = std::filesystem::temp_directory_path() / "muon_config_inputs_dir";
  std::filesystem::create_directories(dir);
  expect_bounded_error([&] { muon::load_config_file(c, dir.string()); },
                       {"'" + dir.string() + "' is a directory, not a JSON config file"});
  expect_bounded_error(parse_flags(c, {"--config", dir.string(), "--lr", "0.1"}), {dir.string(), "is a directory"});
  expect_bounded_error([&] { muon::load_config_file(c, (dir / "missing.json").string()); },
                       {"cannot open config file", "missing.json", "No such file or directory"});
  expect_bounded_error([&] { muon::load_config_file(c, (dir / "missing.json" / "x").string()); },
                       {"cannot open config file", "missing.json/x"});
  const auto deep_file = (dir / "deep.json").string();
  {
    std::FILE* f = std::fopen(deep_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const auto text = "{\"lr\": " + nested(100000, "[", "", "]") + "}";
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  expect_bounded_error([&] { muon::load_config_file(c, deep_file); },
                       {"[muon::OptimizerConfig] in config file '" + deep_file + "'", "nesting deeper than 64"});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(c.values(), OptimizerConfig().values());
}

}  // namespace
}  // namespace muon::test
