#pragma once

/// Options and per-parameter states that list their fields once and get
/// their archive form, equality and settings digest from the list.
///
/// `ListedOptions<Self>` is a group's options. `Self` declares its
/// constructor and fields with MUON_OPTIONS (below): each field's type, name,
/// default and rule (muon::FieldRule: its range and doc line) once, the
/// default lr in the constructor. Options that declare
/// their fields themselves (TORCH_ARG) list them after the declarations:
///
///   MUON_LISTED_FIELDS(lr, beta1, ...)
///
/// Either way `Self` has `kFields` (the archive keys "lr", "beta1", ...: the field
/// names) and `fields(o)` (a std::tie of o's fields, same order, o const or
/// not), with `lr` among them; `Self` gets `serialize` (each field under its key;
/// enums by their names, dtypes by torch's names), field-wise equality,
/// `mix_settings` (every field but lr) and `get_lr`/`set_lr`; it writes its
/// own `validate`. Field types: double, bool, int64_t, std::string,
/// at::ScalarType, and enums with `to_string` (the library defines their
/// parsers where it instantiates the options).
///
/// `ListedParamState<Self, N>` is a state of a step counter and N buffers;
/// `Self` declares them once, `MUON_STATE_BUFFERS(exp_avg, ...)` (or lists
/// its own TORCH_ARG buffers, `MUON_LISTED_BUFFERS(exp_avg, ...)`), which gives
/// `kBuffers` (their archive keys: the names) and `buffers()` (pointers to
/// them), and gets serialize, bit-equality and `const_buffers`.
///
/// The members are defined in the library and instantiated there for each
/// of its optimizers (muon::Soap, muon::Dion2, the element-wise ones of
/// muon/optim/elementwise.h).
#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <tuple>

#include "muon/optim/settings_digest.h"

// MUON_LISTED_EACH_(m, s, a, b, ...) is m(a) s() m(b) s() ... for 1 to 20 arguments:
// s is MUON_LISTED_COMMA_ (a list) or MUON_LISTED_NONE_ (declarations).
#define MUON_LISTED_CAT_(a, b) MUON_LISTED_CAT2_(a, b)
#define MUON_LISTED_CAT2_(a, b) a##b
#define MUON_LISTED_NTH_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, \
                         _17, _18, _19, _20, n, ...)                                            \
  n
#define MUON_LISTED_COUNT_(...)                                                                  \
  MUON_LISTED_NTH_(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, \
                   2, 1, 0)
#define MUON_LISTED_EACH_(m, s, ...) \
  MUON_LISTED_CAT_(MUON_LISTED_EACH_, MUON_LISTED_COUNT_(__VA_ARGS__))(m, s, __VA_ARGS__)
#define MUON_LISTED_COMMA_() ,
#define MUON_LISTED_NONE_()
#define MUON_LISTED_EACH_1(m, s, a) m(a)
#define MUON_LISTED_EACH_2(m, s, a, ...) m(a) s() MUON_LISTED_EACH_1(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_3(m, s, a, ...) m(a) s() MUON_LISTED_EACH_2(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_4(m, s, a, ...) m(a) s() MUON_LISTED_EACH_3(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_5(m, s, a, ...) m(a) s() MUON_LISTED_EACH_4(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_6(m, s, a, ...) m(a) s() MUON_LISTED_EACH_5(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_7(m, s, a, ...) m(a) s() MUON_LISTED_EACH_6(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_8(m, s, a, ...) m(a) s() MUON_LISTED_EACH_7(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_9(m, s, a, ...) m(a) s() MUON_LISTED_EACH_8(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_10(m, s, a, ...) m(a) s() MUON_LISTED_EACH_9(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_11(m, s, a, ...) m(a) s() MUON_LISTED_EACH_10(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_12(m, s, a, ...) m(a) s() MUON_LISTED_EACH_11(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_13(m, s, a, ...) m(a) s() MUON_LISTED_EACH_12(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_14(m, s, a, ...) m(a) s() MUON_LISTED_EACH_13(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_15(m, s, a, ...) m(a) s() MUON_LISTED_EACH_14(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_16(m, s, a, ...) m(a) s() MUON_LISTED_EACH_15(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_17(m, s, a, ...) m(a) s() MUON_LISTED_EACH_16(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_18(m, s, a, ...) m(a) s() MUON_LISTED_EACH_17(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_19(m, s, a, ...) m(a) s() MUON_LISTED_EACH_18(m, s, __VA_ARGS__)
#define MUON_LISTED_EACH_20(m, s, a, ...) m(a) s() MUON_LISTED_EACH_19(m, s, __VA_ARGS__)
#define MUON_LISTED_KEY_(name) #name
#define MUON_LISTED_MEMBER_(name) o.name##_
#define MUON_LISTED_POINTER_(name) &name##_

/// In an options struct, after its TORCH_ARG fields: `kFields`, the names of
/// the fields (their archive keys), and `fields(o)`, a std::tie of o's fields
/// in that order (o const or not).
#define MUON_LISTED_FIELDS(...)                                                                              \
  static constexpr std::array kFields{MUON_LISTED_EACH_(MUON_LISTED_KEY_, MUON_LISTED_COMMA_, __VA_ARGS__)}; \
  template <typename O>                                                                                      \
  static auto fields(O& o) {                                                                                 \
    return std::tie(MUON_LISTED_EACH_(MUON_LISTED_MEMBER_, MUON_LISTED_COMMA_, __VA_ARGS__));                \
  }

/// In a per-parameter state, after its TORCH_ARG buffers: `kBuffers`, their
/// names (archive keys), and `buffers()`, pointers to them in that order.
#define MUON_LISTED_BUFFERS(...)                                                                              \
  static constexpr std::array kBuffers{MUON_LISTED_EACH_(MUON_LISTED_KEY_, MUON_LISTED_COMMA_, __VA_ARGS__)}; \
  std::array<at::Tensor*, kBuffers.size()> buffers() {                                                        \
    return {MUON_LISTED_EACH_(MUON_LISTED_POINTER_, MUON_LISTED_COMMA_, __VA_ARGS__)};                        \
  }

/// An options struct's constructor and fields, each name written once:
///
///   struct LionOptions : public ListedOptions<LionOptions> {
///     MUON_OPTIONS(LionOptions, 1e-4,
///         /// Interpolation weight of the momentum, in [0, 1).
///         (double, beta1, 0.9, rule::decay("interpolation weight of the momentum")),
///         (double, weight_decay, 0.0, rule::non_negative("decoupled weight decay")))
///     void validate() const;
///   };
///
/// declares `LionOptions(double lr = 1e-4)` (torch's pattern: the learning
/// rate first, every other field at its default; the only place the default
/// lr is written), the field `lr`, a `TORCH_ARG(type, name) = default` for
/// each `(type, name, default[, rule])`, MUON_LISTED_FIELDS(lr, beta1,
/// weight_decay): kFields and fields(o) in that order, and `kRules`, each
/// field's muon::FieldRule in that order (lr's: >= 0; a row without a rule:
/// rule::any). What follows it is public.
#define MUON_OPTIONS(Self, lr_default, ...)                                                      \
  Self(double lr = lr_default) : lr_(lr) {} /* NOLINT: torch's implicit form */                  \
  TORCH_ARG(double, lr);                                                                         \
  MUON_LISTED_EACH_(MUON_OPTIONS_FIELD_, MUON_LISTED_NONE_, __VA_ARGS__)                         \
 public:                                                                                         \
  MUON_LISTED_FIELDS(lr, MUON_LISTED_EACH_(MUON_OPTIONS_NAME_, MUON_LISTED_COMMA_, __VA_ARGS__)) \
  static constexpr std::array<::muon::FieldRule, kFields.size()> kRules{                         \
      ::muon::rule::non_negative("learning rate"),                                               \
      MUON_LISTED_EACH_(MUON_OPTIONS_RULE_, MUON_LISTED_COMMA_, __VA_ARGS__)};
// A row is (type, name, default) or (type, name, default, rule): the macros
// below take `default[, rule]` as their variadic part and pick from it with
// a trailing empty argument, so a row without a rule needs no empty one.
#define MUON_OPTIONS_FIELD_(field) MUON_OPTIONS_FIELD2_ field
#define MUON_OPTIONS_FIELD2_(type, name, ...) TORCH_ARG(type, name) = MUON_OPTIONS_HEAD_(__VA_ARGS__, );
#define MUON_OPTIONS_NAME_(field) MUON_OPTIONS_NAME2_ field
#define MUON_OPTIONS_NAME2_(type, name, ...) name
#define MUON_OPTIONS_RULE_(field) MUON_OPTIONS_RULE2_ field
#define MUON_OPTIONS_RULE2_(type, name, ...) \
  ::muon::FieldRule { MUON_OPTIONS_TAIL_(__VA_ARGS__, ) }
#define MUON_OPTIONS_HEAD_(value, ...) value
#define MUON_OPTIONS_TAIL_(value, ...) __VA_ARGS__

/// A per-parameter state's buffers, each name written once:
/// `MUON_STATE_BUFFERS(exp_avg, exp_avg_sq)` declares a
/// `TORCH_ARG(at::Tensor, name)` for each, then MUON_LISTED_BUFFERS of the
/// same names. What follows it is public.
#define MUON_STATE_BUFFERS(...)                                         \
  MUON_LISTED_EACH_(MUON_STATE_BUFFER_, MUON_LISTED_NONE_, __VA_ARGS__) \
 public:                                                                \
  MUON_LISTED_BUFFERS(__VA_ARGS__)
#define MUON_STATE_BUFFER_(name) TORCH_ARG(at::Tensor, name);

/// A whole options struct from its description: the struct `Self`, a
/// muon::ListedOptions<Self>, with MUON_OPTIONS(Self, lr_default, fields...)
/// and `void validate() const`, which the library defines: each field
/// checked by its rule (and the checks across fields), raising
/// c10::ValueError "[<kind>] <field> must be ..., got <value>".
///
///   MUON_DEFINE_OPTIONS(LionOptions, 1e-4,
///       /// Interpolation weight of the momentum, in [0, 1).
///       (double, beta1, 0.9, rule::decay("interpolation weight of the momentum")),
///       (double, weight_decay, 0.0, rule::non_negative("decoupled weight decay")));
///
/// An options struct with members of its own (a parsing setter, say) is
/// written out, with MUON_OPTIONS inside it.
#define MUON_DEFINE_OPTIONS(Self, lr_default, ...)   \
  struct Self : public ::muon::ListedOptions<Self> { \
    MUON_OPTIONS(Self, lr_default, __VA_ARGS__)      \
    void validate() const;                           \
  }

/// A whole per-parameter state from its buffers' names: the struct `Self`, a
/// muon::ListedParamState of `step` and as many buffers as are named, with
/// MUON_STATE_BUFFERS of them (`MUON_DEFINE_STATE(LionParamState, exp_avg);`).
#define MUON_DEFINE_STATE(Self, ...)                                                     \
  struct Self : public ::muon::ListedParamState<Self, MUON_LISTED_COUNT_(__VA_ARGS__)> { \
    MUON_STATE_BUFFERS(__VA_ARGS__)                                                      \
  }

namespace muon {

/// What an options field accepts, and the line --help shows for it: the
/// fourth element of a MUON_OPTIONS row, written with the makers of
/// muon::rule. The library checks a listed field by its rule in the
/// options' validate() ("[<kind>] <field> must be in [0, 1), got 1.5") and
/// declares the field's registry entry from it (the same bounds, the doc,
/// the choices), so a field's range is written once.
struct FieldRule {
  /// One line of documentation (the registry entry's doc of the field).
  const char* doc = "";
  /// Bounds of a number; a bounded number must also be finite.
  double min = -std::numeric_limits<double>::infinity();
  /// See `min`.
  double max = std::numeric_limits<double>::infinity();
  /// Whether `min` itself is excluded.
  bool min_exclusive = false;
  /// Whether `max` itself is excluded.
  bool max_exclusive = false;
  /// A number must be finite (implied by a bound).
  bool finite = false;
  /// A string's allowed values, "a|b|c" (nullptr: any string).
  const char* choices = nullptr;
  /// Why the rule is what it is, added to its error message (nullptr: nothing).
  const char* why = nullptr;

  /// This rule with `min` excluded.
  constexpr FieldRule open_min() const {
    FieldRule r = *this;
    r.min_exclusive = true;
    return r;
  }
  /// This rule with `max` excluded.
  constexpr FieldRule open_max() const {
    FieldRule r = *this;
    r.max_exclusive = true;
    return r;
  }
  /// This rule, its error message saying `reason`.
  constexpr FieldRule because(const char* reason) const {
    FieldRule r = *this;
    r.why = reason;
    return r;
  }
  /// Whether a number is bounded on either side.
  constexpr bool bounded() const {
    return min > -std::numeric_limits<double>::infinity() || max < std::numeric_limits<double>::infinity();
  }
};

/// The makers of FieldRule, one per kind of range.
namespace rule {
/// Any value (a bool, an index, a number with no range).
constexpr FieldRule any(const char* doc) { return FieldRule{doc}; }
/// A finite number.
constexpr FieldRule finite(const char* doc) {
  FieldRule r{doc};
  r.finite = true;
  return r;
}
/// A finite number >= `lo`.
constexpr FieldRule at_least(const char* doc, double lo) {
  FieldRule r{doc};
  r.min = lo;
  return r;
}
/// A finite number >= 0.
constexpr FieldRule non_negative(const char* doc) { return at_least(doc, 0); }
/// A finite number > 0.
constexpr FieldRule positive(const char* doc) { return at_least(doc, 0).open_min(); }
/// A number in [lo, hi].
constexpr FieldRule in(const char* doc, double lo, double hi) {
  FieldRule r{doc};
  r.min = lo;
  r.max = hi;
  return r;
}
/// An Adam-style denominator's eps, > 0: it keeps 0/0 out of a zero gradient element.
constexpr FieldRule denominator_eps(const char* doc) {
  return positive(doc).because("it keeps 0/0 out of a zero gradient element");
}
/// A decay or momentum, in [0, 1): at 1 it never forgets.
constexpr FieldRule decay(const char* doc) { return in(doc, 0, 1).open_max(); }
/// A string, one of `choices` ("a|b|c").
constexpr FieldRule one_of(const char* doc, const char* choices) {
  FieldRule r{doc};
  r.choices = choices;
  return r;
}
/// Emerging-Optimizers' weight decay methods (WeightDecayMixin): "decoupled"
/// (p ← p − lr·wd·p), "independent" (p ← p − wd·p), "l2" (wd·p added to the gradient).
constexpr FieldRule weight_decay_method() {
  return one_of("how weight decay enters the step", "decoupled|independent|l2");
}
}  // namespace rule

/// Options whose fields `Self` lists (see the top of this header).
template <typename Self>
struct ListedOptions : public torch::optim::OptimizerCloneableOptions<Self>,
                       public DigestibleOptions {
  /// Reads every field written by the other overload.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes every field under its key.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// Mixes every field but lr into `digest`, in the list's order.
  void mix_settings(SettingsDigest& digest) const override;
  /// Field-wise equality.
  friend bool operator==(const Self& lhs, const Self& rhs) {
    return Self::fields(lhs) == Self::fields(rhs);
  }
  /// `lr()`, for LR schedulers.
  double get_lr() const override { return static_cast<const Self&>(*this).lr(); }
  /// `lr(lr)`, for LR schedulers.
  void set_lr(double lr) override { static_cast<Self&>(*this).lr(lr); }
  ~ListedOptions() override = default;
};

/// A per-parameter state of `step` and the N buffers `Self` lists as
/// `static constexpr std::array<const char*, N> kBuffers` (archive keys) and
/// `std::array<at::Tensor*, N> buffers()`.
template <typename Self, size_t N>
struct ListedParamState : public torch::optim::OptimizerCloneableParamState<Self> {
  /// Steps taken on this parameter.
  TORCH_ARG(int64_t, step) = 0;

 public:
  /// Reads `step` and every buffer the archive holds (an absent one is left undefined).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes `step` and every defined buffer under its key.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The buffers, read-only.
  std::array<const at::Tensor*, N> const_buffers() const;
  /// Equal step and bit-equal buffers (both undefined, or equal).
  friend bool operator==(const Self& lhs, const Self& rhs) { return lhs.equals(rhs); }
  ~ListedParamState() override = default;

 private:
  bool equals(const Self& other) const;
};

}  // namespace muon
