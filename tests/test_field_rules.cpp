// Each field of the options written with MUON_OPTIONS carries its rule
// (muon::FieldRule: doc line, bounds, choices) in its row, and both the
// options' validate() and the optimizer's registry entry come from it.
// These tests probe every rule of every such optimizer from both sides: a
// value outside the rule is refused by validate() (naming the kind and the
// field) and by the config (naming the prefixed field), a value at an
// included bound is taken by both, and the entry declares each field with
// the rule's doc, bounds and choices and the options' own default. A rule
// that one path forgot, or an entry written apart from its options, fails
// by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "expect_util.h"
#include "muon/muon.h"
#include "muon/registry.h"
#include "option_fields.h"
#include "optim/option_checks.h"

namespace muon::test {
namespace {

// The optimizers whose options carry their rules, as types.
template <class T>
struct Type {
  using type = T;
};
using Optimizers = std::tuple<Type<Lion>, Type<LaProp>, Type<Signum>, Type<SimAdEMAMix>, Type<ObliqueSGD>,
                              Type<ObliqueAdam>, Type<Iso>, Type<Moso>, Type<PsgdPro>, Type<Dion>, Type<KlSoap>>;

// Values just outside `rule`'s bounds (the next representable double, or
// the next integer), for a double field when `integer` is false.
std::vector<double> outside(const FieldRule& rule, bool integer) {
  std::vector<double> out;
  const auto step = [&](double b, double dir) { return integer ? b + dir : std::nextafter(b, b + dir); };
  if (std::isfinite(rule.min)) out.push_back(rule.min_exclusive ? rule.min : step(rule.min, -1));
  if (std::isfinite(rule.max)) out.push_back(rule.max_exclusive ? rule.max : step(rule.max, 1));
  if (!integer && (rule.finite || rule.bounded())) out.push_back(std::numeric_limits<double>::quiet_NaN());
  return out;
}

// The included bounds of `rule`.
std::vector<double> included(const FieldRule& rule) {
  std::vector<double> out;
  if (std::isfinite(rule.min) && !rule.min_exclusive) out.push_back(rule.min);
  if (std::isfinite(rule.max) && !rule.max_exclusive) out.push_back(rule.max);
  return out;
}

template <class T, class V>
void assign(T& field, const V& value) {
  if constexpr (std::is_same_v<T, std::string> && std::is_same_v<V, std::string>) field = value;
  if constexpr (std::is_arithmetic_v<T> && std::is_arithmetic_v<V>) field = static_cast<T>(value);
}

// Options() with its listed field `name` set to `value` (a number or a string), then validated.
template <class Options, class V>
void validate_with(const std::string& name, const V& value) {
  Options o;
  size_t i = 0;
  std::apply([&](auto&... field) { ((Options::kFields[i++] == name ? assign(field, value) : void()), ...); },
             Options::fields(o));
  o.validate();
}

// The spec Opt's entry declares for `name`, or nullptr.
template <class Opt>
const FieldSpec* declared_spec(const std::string& name) {
  static const auto entry = OptimizerRegistry::global().at(Opt::kNames.prefix);
  for (const auto& f : entry->fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// Both paths of one field of Opt: validate() and the config's field
// "<prefix>_<name>" (when the entry declares it: lr and weight_decay are
// common fields, checked under their own names).
template <class Opt, class T>
void probe_field(const std::string& name, const FieldRule& rule) {
  using Options = typename Opt::OptionsType;
  const std::string kind = Opt::kNames.kind;
  const std::string key = std::string(Opt::kNames.prefix) + "_" + name;
  const bool declared = declared_spec<Opt>(name) != nullptr;
  SCOPED_TRACE(kind + " " + name);
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int64_t>) {
    for (const double v : outside(rule, std::is_same_v<T, int64_t>)) {
      expect_value_error([&] { validate_with<Options>(name, v); }, {"[" + kind + "] " + name + " must be "});
      OptimizerConfig config;
      if (declared) expect_value_error([&] { config.set(key, static_cast<T>(v)); }, {key});
    }
    for (const double v : included(rule)) {
      validate_with<Options>(name, v);
      OptimizerConfig config;
      if (declared) config.set(key, static_cast<T>(v));
    }
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (rule.choices == nullptr) return;
    expect_value_error([&] { validate_with<Options>(name, std::string("none_such")); },
                       {"[" + kind + "] unknown " + name + " 'none_such'"});
    OptimizerConfig config;
    if (declared) expect_value_error([&] { config.set(key, std::string("none_such")); }, {key, "none_such"});
    for (const auto& choice : detail::rule_choices(rule)) {
      // KL-SOAP's own kind takes "decoupled" alone (MessagesSayTheRange).
      if (!std::is_same_v<Options, KlSoapOptions> || name != "weight_decay_method") validate_with<Options>(name, choice);
      if (declared) config.set(key, choice);
    }
  }
}

// The entry's spec of listed field `name` (when declared): the rule's doc,
// bounds and choices, and the options' own default `def`.
template <class Opt, class T>
void expect_spec(const std::string& name, const FieldRule& rule, const T& def, std::vector<std::string>& names) {
  const FieldSpec* spec = declared_spec<Opt>(name);
  if (spec == nullptr) return;
  names.push_back(name);
  SCOPED_TRACE(std::string(Opt::kNames.prefix) + " " + name);
  EXPECT_EQ(spec->doc, rule.doc);
  EXPECT_EQ(spec->choices, detail::rule_choices(rule));
  EXPECT_EQ(spec->min.value_or(-INFINITY), rule.min);
  EXPECT_EQ(spec->max.value_or(INFINITY), rule.max);
  EXPECT_EQ(spec->min_exclusive, rule.min_exclusive);
  EXPECT_EQ(spec->max_exclusive, rule.max_exclusive);
  ASSERT_TRUE(std::holds_alternative<T>(spec->default_value));
  EXPECT_EQ(std::get<T>(spec->default_value), def);
}

template <class Opt, size_t... I>
void probe_every_field(std::index_sequence<I...> /*fields*/) {
  using Options = typename Opt::OptionsType;
  const Options defaults;
  (probe_field<Opt, std::decay_t<decltype(std::get<I>(Options::fields(defaults)))>>(Options::kFields[I],
                                                                                    Options::kRules[I]),
   ...);
  // The entry declares the listed fields, in their order, but lr and weight_decay (common
  // fields), KL-SOAP's kind (the entry's name) and its weight_decay_method (rekls' only).
  std::vector<std::string> names;
  (expect_spec<Opt>(Options::kFields[I], Options::kRules[I], std::get<I>(Options::fields(defaults)), names), ...);
  std::vector<std::string> expected;
  for (const std::string name : Options::kFields) {
    const bool kl_soap_own = std::is_same_v<Options, KlSoapOptions> && (name == "kind" || name == "weight_decay_method");
    if (name != "lr" && name != "weight_decay" && !kl_soap_own) expected.push_back(name);
  }
  EXPECT_EQ(names, expected) << Opt::kNames.prefix;
  std::vector<std::string> all;
  for (const auto& f : OptimizerRegistry::global().at(Opt::kNames.prefix)->fields) all.push_back(f.name);
  EXPECT_EQ(all, expected) << Opt::kNames.prefix;
}

TEST(FieldRules, ValidateTheConfigAndTheEntryFollowEachRule) {
  std::apply(
      [](auto... opt) {
        (probe_every_field<typename decltype(opt)::type>(
             std::make_index_sequence<decltype(opt)::type::OptionsType::kFields.size()>()),
         ...);
      },
      Optimizers{});
  // rekls alone among the KL-SOAP kinds declares weight_decay_method.
  const auto rekls = OptimizerRegistry::global().at("rekls");
  EXPECT_EQ(rekls->fields.back().name, "weight_decay_method");
}

// The messages say the rule: its range as written, and why where it says.
TEST(FieldRules, MessagesSayTheRange) {
  const std::vector<std::pair<std::function<void()>, std::string>> cases{
      {[] { DionOptions().rank_fraction(0).validate(); }, "[muon::Dion] rank_fraction must be in (0, 1], got 0"},
      {[] { DionOptions().power_iters(17).validate(); }, "[muon::Dion] power_iters must be in [1, 16], got 17"},
      {[] { PsgdProOptions().warmup_steps(0).validate(); }, "[muon::PsgdPro] warmup_steps must be >= 1, got 0"},
      {[] { MosoOptions().eps(0).validate(); }, "[muon::Moso] eps must be > 0, got 0"},
      {[] { LionOptions().beta2(1).validate(); }, "[muon::Lion] beta2 must be in [0, 1), got 1"},
      {[] { SimAdEMAMixOptions().alpha(INFINITY).validate(); }, "[muon::SimAdEMAMix] alpha must be finite, got inf"},
      {[] { LaPropOptions().eps(-1).validate(); },
       "[muon::LaProp] eps must be > 0 (it keeps 0/0 out of a zero gradient element), got -1"},
      {[] { IsoOptions().retraction("exp").validate(); },
       "[muon::Iso] unknown retraction 'exp'; valid names: qr, polar, cayley"},
      {[] { IsoOptions().weight_decay(0.5).validate(); }, "[muon::Iso] weight_decay must be 0"},
      {[] { DionOptions().qr_method("rc").validate(); }, "[muon::Dion] unknown qr_method 'rc'"},
      {[] { DionOptions().qr_method("qrx").validate(); }, "[muon::Dion] unknown qr_method 'qrx'"},
      {[] { PsgdProOptions().min_precond_lr(0.5).validate(); },
       "[muon::PsgdPro] min_precond_lr must be in [0, precond_lr"},
      {[] { KlSoapOptions().weight_decay_method("l2").validate(); },
       "[muon::KlSoap] weight_decay_method must be 'decoupled' for kl_soap"},
  };
  for (const auto& [check, words] : cases) {
    const auto what = error_of<c10::ValueError>(check);
    EXPECT_EQ(what.rfind(words, 0), 0u) << what;
  }
  KlSoapOptions().kind("rekls").weight_decay_method("l2").validate();  // rekls takes the others
}

}  // namespace
}  // namespace muon::test
