#pragma once

/// Options and per-parameter states that list their fields once and get
/// their archive form, equality and settings digest from the list.
///
/// `ListedOptions<Self>` is a group's options. `Self` lists its fields once,
/// after their TORCH_ARG declarations:
///
///   MUON_LISTED_FIELDS(lr, beta1, ...)
///
/// which declares `kFields` (the archive keys "lr", "beta1", ...: the field
/// names) and `fields(o)` (a std::tie of o's fields, same order, o const or
/// not), with `lr` among them; `Self` gets `serialize` (each field under its key;
/// enums by their names, dtypes by torch's names), field-wise equality,
/// `mix_settings` (every field but lr) and `get_lr`/`set_lr`; it writes its
/// own `validate`. Field types: double, bool, int64_t, std::string,
/// at::ScalarType, and enums with `to_string` (the library defines their
/// parsers where it instantiates the options).
///
/// `ListedParamState<Self, N>` is a state of a step counter and N buffers;
/// `Self` lists them once, `MUON_LISTED_BUFFERS(exp_avg, ...)`, which declares
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
#include <tuple>

#include "muon/optim/settings_digest.h"

// MUON_LISTED_EACH_(m, a, b, ...) is m(a), m(b), ... for 1 to 20 arguments.
#define MUON_LISTED_CAT_(a, b) MUON_LISTED_CAT2_(a, b)
#define MUON_LISTED_CAT2_(a, b) a##b
#define MUON_LISTED_NTH_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, \
                         _17, _18, _19, _20, n, ...)                                            \
  n
#define MUON_LISTED_COUNT_(...)                                                                  \
  MUON_LISTED_NTH_(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, \
                   2, 1, 0)
#define MUON_LISTED_EACH_(m, ...) \
  MUON_LISTED_CAT_(MUON_LISTED_EACH_, MUON_LISTED_COUNT_(__VA_ARGS__))(m, __VA_ARGS__)
#define MUON_LISTED_EACH_1(m, a) m(a)
#define MUON_LISTED_EACH_2(m, a, ...) m(a), MUON_LISTED_EACH_1(m, __VA_ARGS__)
#define MUON_LISTED_EACH_3(m, a, ...) m(a), MUON_LISTED_EACH_2(m, __VA_ARGS__)
#define MUON_LISTED_EACH_4(m, a, ...) m(a), MUON_LISTED_EACH_3(m, __VA_ARGS__)
#define MUON_LISTED_EACH_5(m, a, ...) m(a), MUON_LISTED_EACH_4(m, __VA_ARGS__)
#define MUON_LISTED_EACH_6(m, a, ...) m(a), MUON_LISTED_EACH_5(m, __VA_ARGS__)
#define MUON_LISTED_EACH_7(m, a, ...) m(a), MUON_LISTED_EACH_6(m, __VA_ARGS__)
#define MUON_LISTED_EACH_8(m, a, ...) m(a), MUON_LISTED_EACH_7(m, __VA_ARGS__)
#define MUON_LISTED_EACH_9(m, a, ...) m(a), MUON_LISTED_EACH_8(m, __VA_ARGS__)
#define MUON_LISTED_EACH_10(m, a, ...) m(a), MUON_LISTED_EACH_9(m, __VA_ARGS__)
#define MUON_LISTED_EACH_11(m, a, ...) m(a), MUON_LISTED_EACH_10(m, __VA_ARGS__)
#define MUON_LISTED_EACH_12(m, a, ...) m(a), MUON_LISTED_EACH_11(m, __VA_ARGS__)
#define MUON_LISTED_EACH_13(m, a, ...) m(a), MUON_LISTED_EACH_12(m, __VA_ARGS__)
#define MUON_LISTED_EACH_14(m, a, ...) m(a), MUON_LISTED_EACH_13(m, __VA_ARGS__)
#define MUON_LISTED_EACH_15(m, a, ...) m(a), MUON_LISTED_EACH_14(m, __VA_ARGS__)
#define MUON_LISTED_EACH_16(m, a, ...) m(a), MUON_LISTED_EACH_15(m, __VA_ARGS__)
#define MUON_LISTED_EACH_17(m, a, ...) m(a), MUON_LISTED_EACH_16(m, __VA_ARGS__)
#define MUON_LISTED_EACH_18(m, a, ...) m(a), MUON_LISTED_EACH_17(m, __VA_ARGS__)
#define MUON_LISTED_EACH_19(m, a, ...) m(a), MUON_LISTED_EACH_18(m, __VA_ARGS__)
#define MUON_LISTED_EACH_20(m, a, ...) m(a), MUON_LISTED_EACH_19(m, __VA_ARGS__)
#define MUON_LISTED_KEY_(name) #name
#define MUON_LISTED_MEMBER_(name) o.name##_
#define MUON_LISTED_POINTER_(name) &name##_

/// In an options struct, after its TORCH_ARG fields: `kFields`, the names of
/// the fields (their archive keys), and `fields(o)`, a std::tie of o's fields
/// in that order (o const or not).
#define MUON_LISTED_FIELDS(...)                                                          \
  static constexpr std::array kFields{MUON_LISTED_EACH_(MUON_LISTED_KEY_, __VA_ARGS__)}; \
  template <typename O>                                                                  \
  static auto fields(O& o) {                                                             \
    return std::tie(MUON_LISTED_EACH_(MUON_LISTED_MEMBER_, __VA_ARGS__));                \
  }

/// In a per-parameter state, after its TORCH_ARG buffers: `kBuffers`, their
/// names (archive keys), and `buffers()`, pointers to them in that order.
#define MUON_LISTED_BUFFERS(...)                                                          \
  static constexpr std::array kBuffers{MUON_LISTED_EACH_(MUON_LISTED_KEY_, __VA_ARGS__)}; \
  std::array<at::Tensor*, kBuffers.size()> buffers() {                                    \
    return {MUON_LISTED_EACH_(MUON_LISTED_POINTER_, __VA_ARGS__)};                        \
  }

namespace muon {

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
