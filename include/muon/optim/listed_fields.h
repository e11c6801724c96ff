#pragma once

/// Options and per-parameter states that list their fields once and get
/// their archive form, equality and settings digest from the list.
///
/// `ListedOptions<Self>` is a group's options. `Self` lists its fields:
///
///   static constexpr std::array<const char*, M> kFields{"lr", ...};  // archive keys
///   template <typename O> static auto fields(O& o) {                 // std::tie of o's
///     return std::tie(o.lr_, ...);                                   // fields, same order
///   }
///
/// with `lr` among them, and gets `serialize` (each field under its key;
/// enums by their names, dtypes by torch's names), field-wise equality,
/// `mix_settings` (every field but lr) and `get_lr`/`set_lr`; it writes its
/// own `validate`. Field types: double, bool, int64_t, std::string,
/// at::ScalarType, and enums with `to_string` (the library defines their
/// parsers where it instantiates the options).
///
/// `ListedParamState<Self, N>` is a state of a step counter and N buffers;
/// `Self` lists them (`kBuffers`, their archive keys, and `buffers()`,
/// pointers to them) and gets serialize, bit-equality and `const_buffers`.
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

#include "muon/optim/settings_digest.h"

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
