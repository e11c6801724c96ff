// muon::ListedOptions (muon/optim/listed_fields.h): for every options type
// that lists its fields, each field on its own (a) survives the archive,
// enums and dtypes included, (b) makes the options unequal, and (c) changes
// the settings digest, lr alone excepted (schedulers change it per step).
// Each case changes exactly one field from the defaults, so a field written
// but not read (or read under another key), left out of equality or of the
// digest fails by name.
#include <gtest/gtest.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "archive_util.h"
#include "muon/optim/dion2.h"
#include "muon/optim/laprop.h"
#include "muon/optim/lion.h"
#include "muon/optim/signum.h"
#include "muon/optim/sim_ademamix.h"
#include "muon/optim/soap.h"
#include "util/names.h"

namespace {

using namespace muon;

// Another value of `v`'s type: valid for every field of these options
// (each enum has at least two values; the dtype is one the fields accept).
template <typename T>
void change(T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    v = !v;
  } else if constexpr (std::is_same_v<T, at::ScalarType>) {
    v = v == at::kDouble ? at::kFloat : at::kDouble;
  } else if constexpr (std::is_enum_v<T>) {
    v = static_cast<T>(static_cast<int>(v) == 0 ? 1 : 0);
  } else if constexpr (std::is_same_v<T, std::string>) {
    v = v == "l2" ? "decoupled" : "l2";
  } else {
    v = v + 1;  // double and int64_t: exact, and in no case equal to v
  }
}

// `o` with its field `i` changed.
template <typename O, size_t I>
O with_field_changed(O o) {
  change(std::get<I>(O::fields(o)));
  return o;
}

// What `out` holds, as a file of it would read.
torch::serialize::InputArchive reopened(torch::serialize::OutputArchive& out) {
  torch::serialize::InputArchive in;
  muon::test::read_back(out, in);
  return in;
}

template <typename O>
O round_trip(const O& o) {
  torch::serialize::OutputArchive out;
  o.serialize(out);
  auto in = reopened(out);
  O back;  // every field at its default, then read
  back.serialize(in);
  return back;
}

template <typename O>
uint64_t digest_of(const O& o) {
  SettingsDigest d;
  o.mix_settings(d);
  return d.value();
}

template <typename O, size_t I>
void check_field(const char* options_name) {
  const O defaults;
  const O changed = with_field_changed<O, I>(defaults);
  const std::string field = O::kFields[I];
  SCOPED_TRACE(std::string(options_name) + "::" + field);
  EXPECT_FALSE(changed == defaults);
  EXPECT_TRUE(round_trip(changed) == changed);
  EXPECT_TRUE(round_trip(defaults) == defaults);
  if (field == "lr") {
    EXPECT_EQ(digest_of(changed), digest_of(defaults));
  } else {
    EXPECT_NE(digest_of(changed), digest_of(defaults));
  }
}

template <typename O, size_t... I>
void check_every_field(const char* options_name, std::index_sequence<I...>) {
  (check_field<O, I>(options_name), ...);
}

template <typename O>
void check_every_field(const char* options_name) {
  check_every_field<O>(options_name, std::make_index_sequence<O::kFields.size()>());
}

TEST(ListedOptions, EveryFieldRoundTripsCountsInEqualityAndInTheDigest) {
  check_every_field<SoapOptions>("SoapOptions");
  check_every_field<Dion2Options>("Dion2Options");
  check_every_field<LionOptions>("LionOptions");
  check_every_field<LaPropOptions>("LaPropOptions");
  check_every_field<SignumOptions>("SignumOptions");
  check_every_field<SimAdEMAMixOptions>("SimAdEMAMixOptions");
}

TEST(ListedOptions, EnumsAndDtypesAreArchivedByTheirNames) {
  torch::serialize::OutputArchive out;
  Dion2Options().adjust_lr("rms_norm").ns_compute_dtype(at::kBFloat16).serialize(out);
  c10::IValue v;
  auto in = reopened(out);
  in.read("adjust_lr", v);
  EXPECT_EQ(v.toStringRef(), "rms_norm");
  in.read("ns_compute_dtype", v);
  EXPECT_EQ(v.toStringRef(), "bfloat16");

  torch::serialize::OutputArchive soap_out;
  SoapOptions().weight_decay_method("independent").serialize(soap_out);
  auto soap_in = reopened(soap_out);
  soap_in.read("weight_decay_method", v);
  EXPECT_EQ(v.toStringRef(), "independent");
}

TEST(ListedOptions, AnUnknownEnumNameInAnArchiveRaisesNamingIt) {
  // Dion2Options' fields in their order up to adjust_lr, which holds a name
  // no mode has: reading stops there.
  torch::serialize::OutputArchive out;
  for (const char* key : {"lr", "fraction", "ef_decay", "weight_decay", "epsilon"}) {
    out.write(key, c10::IValue(0.5));
  }
  out.write("adjust_lr", c10::IValue(std::string("spectral")));
  auto in = reopened(out);
  Dion2Options back;
  try {
    back.serialize(in);
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("adjust_lr"), std::string::npos) << what;
    EXPECT_NE(what.find("spectral"), std::string::npos) << what;
  }
}

// The most fields MUON_LISTED_FIELDS takes, each with its own value.
struct TwentyFields {
  double f1_ = 1, f2_ = 2, f3_ = 3, f4_ = 4, f5_ = 5, f6_ = 6, f7_ = 7, f8_ = 8, f9_ = 9, f10_ = 10,
         f11_ = 11, f12_ = 12, f13_ = 13, f14_ = 14, f15_ = 15, f16_ = 16, f17_ = 17, f18_ = 18,
         f19_ = 19, f20_ = 20;
  MUON_LISTED_FIELDS(f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17, f18, f19, f20)
};

// Two buffers, listed once.
struct TwoBuffers {
  at::Tensor first_;
  at::Tensor second_;
  MUON_LISTED_BUFFERS(first, second)
};

// Field I's key is its name, and fields() ties that very field (the values
// are 1..20 in order); the const overload ties the same, const.
template <size_t I>
void expect_listed_at(TwentyFields& o) {
  const TwentyFields& read_only = o;
  EXPECT_EQ(std::string(TwentyFields::kFields[I]), "f" + std::to_string(I + 1));
  EXPECT_EQ(std::get<I>(TwentyFields::fields(o)), static_cast<double>(I + 1));
  EXPECT_EQ(&std::get<I>(TwentyFields::fields(read_only)), &std::get<I>(TwentyFields::fields(o)));
  static_assert(std::is_const_v<std::remove_reference_t<decltype(std::get<I>(TwentyFields::fields(read_only)))>>);
}

template <size_t... I>
void expect_listed_in_order(std::index_sequence<I...>) {
  TwentyFields o;
  (expect_listed_at<I>(o), ...);
  std::get<19>(TwentyFields::fields(o)) = -1;
  EXPECT_EQ(o.f20_, -1);
}

TEST(ListedFieldsMacros, ListEveryNameOnceAsKeyAndTie) {
  static_assert(TwentyFields::kFields.size() == 20);
  expect_listed_in_order(std::make_index_sequence<20>());

  TwoBuffers b;
  static_assert(TwoBuffers::kBuffers.size() == 2);
  EXPECT_EQ(std::string(TwoBuffers::kBuffers[0]), "first");
  EXPECT_EQ(std::string(TwoBuffers::kBuffers[1]), "second");
  EXPECT_EQ(b.buffers()[0], &b.first_);
  EXPECT_EQ(b.buffers()[1], &b.second_);
}

// The most fields MUON_OPTIONS takes: lr and 19 of its own, of every kind
// of default (a number, a sign, a word, a string, an enum).
enum class Shade { kLight, kDark };
MUON_ENUM_NAMES(Shade, parse_shade);
constexpr muon::detail::EnumName<Shade> kShades[] = {{Shade::kLight, "light"}, {Shade::kDark, "dark"}};
MUON_DEFINE_ENUM_NAMES(Shade, parse_shade, kShades, "[test] ", "shade");

struct NineteenOptions {
  MUON_OPTIONS(NineteenOptions, 0.5,
               /// A comment between the fields is a comment.
               (double, f1, 1.0), (double, f2, -2.0), (int64_t, f3, 3), (bool, f4, true), (std::string, f5, "five"),
               (Shade, f6, Shade::kDark), (double, f7, 7e-7), (double, f8, 8), (double, f9, 9), (double, f10, 10),
               (double, f11, 11), (double, f12, 12), (double, f13, 13), (double, f14, 14), (double, f15, 15),
               (double, f16, 16), (double, f17, 17), (double, f18, 18), (double, f19, 19))
  // What follows the macro is public.
  int after() const { return 1; }
};

// Three buffers declared and listed by one macro.
struct ThreeBuffers {
  MUON_STATE_BUFFERS(first, second, third)
};

TEST(ListedFieldsMacros, OptionsDeclareEveryFieldWithItsDefaultAndListItOnce) {
  static_assert(NineteenOptions::kFields.size() == 20);
  const std::vector<std::string> keys(NineteenOptions::kFields.begin(), NineteenOptions::kFields.end());
  std::vector<std::string> expected{"lr"};
  for (int i = 1; i <= 19; ++i) expected.push_back("f" + std::to_string(i));
  EXPECT_EQ(keys, expected);

  // The constructor's lr, else its default; every other field its own default.
  const NineteenOptions defaults;
  EXPECT_EQ(defaults.lr(), 0.5);
  EXPECT_EQ(NineteenOptions(0.25).lr(), 0.25);
  EXPECT_EQ(defaults.f1(), 1.0);
  EXPECT_EQ(defaults.f2(), -2.0);
  EXPECT_EQ(defaults.f3(), 3);
  EXPECT_TRUE(defaults.f4());
  EXPECT_EQ(defaults.f5(), "five");
  EXPECT_EQ(defaults.f6(), Shade::kDark);
  EXPECT_EQ(defaults.f7(), 7e-7);
  EXPECT_EQ(defaults.f19(), 19.0);
  EXPECT_EQ(defaults.after(), 1);

  // fields() ties the fields themselves, in the listed order; the setters chain.
  NineteenOptions o;
  std::get<0>(NineteenOptions::fields(o)) = 0.125;
  std::get<19>(NineteenOptions::fields(o)) = -19.0;
  EXPECT_EQ(o.lr(), 0.125);
  EXPECT_EQ(o.f19(), -19.0);
  EXPECT_EQ(o.f5("other").f3(4).f5(), "other");
  EXPECT_EQ(std::get<3>(NineteenOptions::fields(o)), 4);
}

TEST(ListedFieldsMacros, StateBuffersAreDeclaredAndListedOnce) {
  static_assert(ThreeBuffers::kBuffers.size() == 3);
  EXPECT_EQ(std::string(ThreeBuffers::kBuffers[0]), "first");
  EXPECT_EQ(std::string(ThreeBuffers::kBuffers[2]), "third");
  ThreeBuffers b;
  b.second(at::ones({2}));
  EXPECT_EQ(b.buffers()[0], &b.first());
  EXPECT_EQ(b.buffers()[1], &b.second());
  EXPECT_EQ(b.buffers()[2], &b.third());
  EXPECT_TRUE(at::equal(*b.buffers()[1], at::ones({2})));
}

// MUON_DEFINE_OPTIONS, MUON_DEFINE_STATE and MUON_DEFINE_ELEMENTWISE define
// the library's types whole: the bases, the buffer count from the names,
// the kind from the class name, and validate() naming that kind.
TEST(ListedFieldsMacros, WholeTypesAreDefinedFromTheirDescription) {
  static_assert(std::is_base_of_v<muon::ListedOptions<muon::LionOptions>, muon::LionOptions>);
  static_assert(std::is_base_of_v<muon::ListedParamState<muon::SoapParamState, 6>, muon::SoapParamState>);
  static_assert(muon::SoapParamState::kBuffers.size() == 6);
  static_assert(std::is_base_of_v<muon::ListedParamState<muon::LaPropParamState, 2>, muon::LaPropParamState>);
  static_assert(std::is_base_of_v<
                muon::ElementwiseOptimizer<muon::SimAdEMAMix, muon::SimAdEMAMixOptions, muon::SimAdEMAMixParamState>,
                muon::SimAdEMAMix>);
  EXPECT_EQ(std::string(muon::SimAdEMAMix::kNames.kind), "muon::SimAdEMAMix");
  EXPECT_EQ(std::string(muon::SimAdEMAMix::kNames.prefix), "sim_ademamix");
  EXPECT_EQ(std::string(muon::LaProp::kNames.kind), "muon::LaProp");
  EXPECT_EQ(std::string(muon::LaProp::kNames.prefix), "laprop");
  EXPECT_EQ(muon::LionOptions().lr(), 1e-4);
  for (const auto& [check, words] : std::vector<std::pair<std::function<void()>, std::string>>{
           {[] { muon::LionOptions().beta1(1.5).validate(); }, "[muon::Lion] beta1"},
           {[] { muon::SignumOptions().momentum(-0.5).validate(); }, "[muon::Signum] momentum"},
           {[] { muon::SimAdEMAMixOptions().alpha(NAN).validate(); }, "[muon::SimAdEMAMix] alpha must be finite"}}) {
    try {
      check();
      ADD_FAILURE() << "no error for " << words;
    } catch (const c10::ValueError& e) {
      const std::string what = e.what_without_backtrace();
      EXPECT_EQ(what.rfind(words, 0), 0u) << what;
    }
  }
}

TEST(ListedFieldsMacros, EnumNamesAreDeclaredAndDefinedFromOneTable) {
  EXPECT_EQ(to_string(Shade::kLight), "light");
  EXPECT_EQ(to_string(Shade::kDark), "dark");
  EXPECT_EQ(parse_shade("dark"), Shade::kDark);
  try {
    parse_shade("grey");
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("[test] unknown shade 'grey'; valid names: light, dark"), std::string::npos) << what;
  }
}

}  // namespace
