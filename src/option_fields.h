// The typed description of an optimizer's option fields: each field's
// FieldSpec (name, default, doc, range) together with how its value enters
// the options, so that a registry entry declares a field once and reads it
// back from the same line. Used by the built-in entries (src/optim/*.cpp,
// src/registry_builtins.cpp); not installed.
#pragma once

#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "muon/compat.h"
#include "muon/registry.h"
#include "optim/option_checks.h"

namespace muon::detail {

/// A setter of Options' field of type T (TORCH_ARG's or a parsing one taking a name).
template <class Options, class T>
using OptionSetter = Options& (Options::*)(const T&);

/// One option field: its spec and how a group's settings set it on Options.
template <class Options>
struct OptionField {
  /// The field (declared without the entry's prefix).
  FieldSpec spec;
  /// Sets the field's value (read from the settings) on the options; may be
  /// empty for a field another one reads (e.g. ns_coefficient_a).
  std::function<void(Options&, const OptimizerSettings&)> apply;
  /// False for a field the entry reads but does not declare (a common field
  /// such as weight_decay, or one of uses_fields_of).
  bool declared = true;

  /// FieldSpec's, chained.
  OptionField& exclusive_min() {
    spec.exclusive_min();
    return *this;
  }
  /// See exclusive_min.
  OptionField& exclusive_max() {
    spec.exclusive_max();
    return *this;
  }
  /// See exclusive_min.
  OptionField& whole_run() {
    spec.whole_run();
    return *this;
  }
  /// Read, not declared (see `declared`), chained.
  OptionField& read_only() {
    declared = false;
    return *this;
  }
};

/// Sets `out` to `value` when `named` and the value's type is T.
template <class T, class V>
void take_if_named([[maybe_unused]] std::optional<T>& out, [[maybe_unused]] bool named,
                   [[maybe_unused]] const V& value) {
  if constexpr (std::is_same_v<std::decay_t<V>, T>) {
    if (named) out = value;
  }
}

/// The default of Options' listed field `name` (MUON_LISTED_FIELDS): its
/// value in Options(), as its TORCH_ARG declares it. A name not listed, or
/// listed with another type than T, raises.
template <class T, class Options>
T listed_default(const std::string& name) {
  const Options defaults;
  std::optional<T> found;
  size_t i = 0;
  std::apply([&](const auto&... value) { (take_if_named<T>(found, name == Options::kFields[i++], value), ...); },
             Options::fields(defaults));
  TORCH_CHECK(found.has_value(), "option field '", name, "' is not a listed field of its type");
  return *found;
}

/// Makers of Options' fields (FieldSpec's makers plus the setter). The
/// makers without a default take the options' own (listed_default).
template <class Options>
struct OptionFields {
  using Field = OptionField<Options>;

  /// The field `spec`, set by `set` from the settings' value read by `read`.
  template <class T, class Read>
  static Field setting(FieldSpec spec, OptionSetter<Options, T> set, Read read) {
    return {spec, [name = spec.name, set, read](Options& o, const OptimizerSettings& s) { (o.*set)((s.*read)(name)); }};
  }

  /// A double field set by `set`.
  static Field real(std::string name, OptionSetter<Options, double> set, double def,
                    std::string doc, std::optional<double> min = std::nullopt,
                    std::optional<double> max = std::nullopt) {
    return setting(FieldSpec::real(name, def, std::move(doc), min, max), set, &OptimizerSettings::get_double);
  }
  /// A bool field set by `set`.
  static Field boolean(std::string name, OptionSetter<Options, bool> set, bool def,
                       std::string doc) {
    return setting(FieldSpec::boolean(name, def, std::move(doc)), set, &OptimizerSettings::get_bool);
  }
  /// An int field set by `set`.
  static Field integer(std::string name, OptionSetter<Options, int64_t> set, int64_t def,
                       std::string doc, std::optional<double> min = std::nullopt,
                       std::optional<double> max = std::nullopt) {
    return setting(FieldSpec::integer(name, def, std::move(doc), min, max), set, &OptimizerSettings::get_int);
  }
  /// A string field (one of `choices` when not empty) set by `set`.
  static Field text(std::string name, OptionSetter<Options, std::string> set, std::string def,
                    std::string doc, std::vector<std::string> choices = {}) {
    return setting(FieldSpec::text(name, std::move(def), std::move(doc), std::move(choices)), set,
                   &OptimizerSettings::get_string);
  }
  /// The common double field `name` (e.g. weight_decay), read, not declared.
  static Field common(std::string name, OptionSetter<Options, double> set) {
    return real(std::move(name), set, 0.0, "").read_only();
  }
  /// A field with its own way into the options (empty `apply`: read by another field's).
  static Field custom(FieldSpec spec,
                      std::function<void(Options&, const OptimizerSettings&)> apply = {}) {
    return {std::move(spec), std::move(apply)};
  }

  // The same makers with the options' own default for the field (listed_default).

  static Field real(const std::string& name, OptionSetter<Options, double> set, std::string doc,
                    std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt) {
    return real(name, set, listed_default<double, Options>(name), std::move(doc), min, max);
  }
  static Field boolean(const std::string& name, OptionSetter<Options, bool> set, std::string doc) {
    return boolean(name, set, listed_default<bool, Options>(name), std::move(doc));
  }
  static Field integer(const std::string& name, OptionSetter<Options, int64_t> set, std::string doc,
                       std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt) {
    return integer(name, set, listed_default<int64_t, Options>(name), std::move(doc), min, max);
  }
  /// A string field, one of `choices`.
  static Field text(const std::string& name, OptionSetter<Options, std::string> set, std::string doc,
                    std::vector<std::string> choices) {
    return text(name, set, listed_default<std::string, Options>(name), std::move(doc), std::move(choices));
  }
};

template <class T>
constexpr bool kNoSpecFor = false;

/// The spec of a listed field `name` of type T from its default and rule
/// (MUON_OPTIONS): the rule's doc, bounds and choices.
template <class T>
FieldSpec spec_by_rule(const std::string& name, const T& def, const FieldRule& rule) {
  const auto bound = [](double b) { return std::isfinite(b) ? std::optional<double>(b) : std::nullopt; };
  FieldSpec spec;
  if constexpr (std::is_same_v<T, double>) {
    spec = FieldSpec::real(name, def, rule.doc, bound(rule.min), bound(rule.max));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    spec = FieldSpec::integer(name, def, rule.doc, bound(rule.min), bound(rule.max));
  } else if constexpr (std::is_same_v<T, bool>) {
    spec = FieldSpec::boolean(name, def, rule.doc);
  } else if constexpr (std::is_same_v<T, std::string>) {
    spec = FieldSpec::text(name, def, rule.doc, rule_choices(rule));
  } else {
    static_assert(kNoSpecFor<T>, "a listed field of this type (an enum, a dtype) needs an OptionField of its own");
  }
  spec.min_exclusive = rule.min_exclusive;
  spec.max_exclusive = rule.max_exclusive;
  return spec;
}

/// The value of field `name` of type T in `settings`.
template <class T>
T setting_of(const OptimizerSettings& settings, const std::string& name) {
  if constexpr (std::is_same_v<T, double>) return settings.get_double(name);
  if constexpr (std::is_same_v<T, int64_t>) return settings.get_int(name);
  if constexpr (std::is_same_v<T, bool>) return settings.get_bool(name);
  if constexpr (std::is_same_v<T, std::string>) return settings.get_string(name);
}

/// Options' listed field I as an entry's field: spec_by_rule of its
/// default (in `defaults`) and rule, set from the settings' value under its name.
template <class Options, size_t I>
OptionField<Options> listed_field(const Options& defaults) {
  const auto& def = std::get<I>(Options::fields(defaults));
  using T = std::decay_t<decltype(def)>;
  return {spec_by_rule<T>(Options::kFields[I], def, Options::kRules[I]), [](Options& o, const OptimizerSettings& s) {
            std::get<I>(Options::fields(o)) = setting_of<T>(s, Options::kFields[I]);
          }};
}

template <class Options, size_t... I>
std::vector<OptionField<Options>> listed_fields_at(std::index_sequence<I...> /*fields*/) {
  const Options defaults;
  return {listed_field<Options, I>(defaults)...};
}

/// The entry's fields of options written with MUON_OPTIONS, from the
/// options' own description: each listed field but lr (the constructor
/// takes it) and those named in `except`, in the list's order, its spec
/// from its default and rule. A field of muon::common_fields() (weight_decay)
/// is read, not declared: every entry reads it under its own name.
template <class Options>
std::vector<OptionField<Options>> listed_option_fields(std::initializer_list<std::string> except = {}) {
  auto all = listed_fields_at<Options>(std::make_index_sequence<Options::kFields.size()>());
  const auto common = common_fields();
  std::vector<OptionField<Options>> out;
  for (auto& f : all) {
    bool keep = f.spec.name != "lr";
    for (const auto& name : except) keep = keep && f.spec.name != name;
    for (const auto& c : common) f.declared = f.declared && c.name != f.spec.name;
    if (keep) out.push_back(std::move(f));
  }
  return out;
}

/// The FieldSpecs `fields` declare, in order.
template <class Options>
std::vector<FieldSpec> declared_specs(const std::vector<OptionField<Options>>& fields) {
  std::vector<FieldSpec> specs;
  for (const auto& f : fields) {
    if (f.declared) specs.push_back(f.spec);
  }
  return specs;
}

/// Sets every field of `fields` on `options` from `settings`, in order.
template <class Options>
void apply_fields(Options& options, const std::vector<OptionField<Options>>& fields,
                  const OptimizerSettings& settings) {
  for (const auto& f : fields) {
    if (f.apply) f.apply(options, settings);
  }
}

template <class Options, class = void>
struct HasValidate : std::false_type {};
template <class Options>
struct HasValidate<Options, std::void_t<decltype(std::declval<const Options&>().validate())>>
    : std::true_type {};

/// Run after the fields, before validate (cross-field checks, fixed settings).
template <class Options>
using OptionsFinish = std::function<void(Options&, const OptimizerSettings&)>;

/// Options(lr) with `fields` applied, then `finish`, then validated where
/// Options has a validate().
template <class Options>
Options options_from(const std::vector<OptionField<Options>>& fields,
                     const OptimizerSettings& settings, const OptionsFinish<Options>& finish = {}) {
  Options o(settings.get_double("lr"));
  apply_fields(o, fields, settings);
  if (finish) finish(o, settings);
  if constexpr (HasValidate<Options>::value) o.validate();
  return o;
}

/// Builds an Opt over groups whose options are Options; the first group's
/// options are the defaults (every group carries its own).
template <class Opt, class Options>
std::unique_ptr<torch::optim::Optimizer> build_optimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups) {
  const auto defaults = static_cast<const Options&>(groups.at(0).options());
  auto opt = std::make_unique<Opt>(groups, defaults);
  compat::reapply_group_options(*opt, groups);
  return opt;
}

/// An entry's factory that builds an Opt with `build_optimizer`.
template <class Opt, class Options>
decltype(OptimizerEntry::factory) build_factory() {
  return [](std::vector<torch::optim::OptimizerParamGroup> groups,
            const std::vector<OptimizerSettings>&) {
    return build_optimizer<Opt, Options>(std::move(groups));
  };
}

/// An entry with its name, state schema and doc line; the rest to fill in.
inline OptimizerEntry bare_entry(std::string name, StateSchema state, std::string doc) {
  OptimizerEntry e;
  e.name = std::move(name);
  e.state = std::move(state);
  e.doc = std::move(doc);
  return e;
}

/// `e`, whose param groups' options are Options, with the weight decay its
/// step applies before its update, as the weight-update hooks read it
/// (OptimizerEntry::hook_weight_decay), the coefficient read from the
/// options in force at each step (OptimizerEntry::hook_weight_decay_of).
template <class Options>
OptimizerEntry hookable(OptimizerEntry e, std::string weight_decay) {
  e.hook_weight_decay = std::move(weight_decay);
  e.hook_weight_decay_of = [name = e.name](const torch::optim::OptimizerOptions& o) {
    const auto* typed = dynamic_cast<const Options*>(&o);
    TORCH_CHECK(typed != nullptr, "optimizer '", name, "': a param group's options are not of its options type");
    return static_cast<double>(typed->weight_decay());
  };
  return e;
}

/// `e` refused by the weight-update hooks, saying why.
inline OptimizerEntry not_hookable(OptimizerEntry e, std::string why) {
  e.hook_weight_decay.clear();
  e.hook_refusal = std::move(why);
  return e;
}

/// The entry of optimizer Opt over Options: `fields` declared (those not
/// read_only), make_options `options_from(fields, settings, finish)` and the
/// factory `build_factory<Opt, Options>`.
template <class Opt, class Options>
OptimizerEntry options_entry(std::string name, StateSchema state, std::string doc,
                             std::vector<OptionField<Options>> fields,
                             OptionsFinish<Options> finish = {}) {
  auto e = bare_entry(std::move(name), std::move(state), std::move(doc));
  e.fields = declared_specs(fields);
  e.make_options = [fields = std::move(fields),
                    finish = std::move(finish)](const OptimizerSettings& s) {
    return std::make_unique<Options>(options_from(fields, s, finish));
  };
  e.factory = build_factory<Opt, Options>();
  return e;
}

}  // namespace muon::detail
