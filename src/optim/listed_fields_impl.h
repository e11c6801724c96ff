// The archive form, equality and settings digest of muon::ListedOptions
// and muon::ListedParamState (muon/optim/listed_fields.h), and the archive
// reads of single values the optimizers' own serialize methods share. Each
// optimizer's source file includes it and instantiates its options and
// state. Internal.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>

#include "muon/optim/listed_fields.h"
#include "muon/optim/settings_digest.h"
#include "util/dtype_names.h"

namespace muon::detail {

/// The double under `key` of `archive`.
inline double read_archived_double(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.toDouble();
}

/// The bool under `key` of `archive`.
inline bool read_archived_bool(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.toBool();
}

/// The int under `key` of `archive`.
inline int64_t read_archived_int(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.toInt();
}

/// The string under `key` of `archive`.
inline std::string read_archived_string(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue v;
  archive.read(key, v);
  return v.toStringRef();
}

/// Writes `buffer` under `key` when it is defined.
inline void write_optional_buffer(torch::serialize::OutputArchive& archive, const char* key,
                                  const at::Tensor& buffer) {
  if (buffer.defined()) archive.write(key, buffer, /*is_buffer=*/true);
}

/// The buffer under `key`, or an undefined tensor when there is none.
inline at::Tensor read_optional_buffer(torch::serialize::InputArchive& archive, const char* key) {
  at::Tensor buffer;
  if (archive.try_read(key, buffer, /*is_buffer=*/true)) return buffer;
  return {};
}

/// Whether `a` and `b` are both undefined, or bit-equal.
inline bool same_buffer(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || at::equal(a, b);
}

/// The enum named `name` (the inverse of its `to_string`); specialized by the
/// source file that instantiates options with a field of type `Enum`.
template <typename Enum>
Enum parse_listed_enum(const std::string& name);

/// Reads the field under `key` into `field`, by its type.
template <typename T>
void read_field(torch::serialize::InputArchive& archive, const char* key, T& field) {
  if constexpr (std::is_same_v<T, double>) {
    field = read_archived_double(archive, key);
  } else if constexpr (std::is_same_v<T, bool>) {
    field = read_archived_bool(archive, key);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    field = read_archived_int(archive, key);
  } else if constexpr (std::is_same_v<T, std::string>) {
    field = read_archived_string(archive, key);
  } else if constexpr (std::is_same_v<T, at::ScalarType>) {
    const std::string what = std::string("the archive's ") + key;
    field = parse_dtype(read_archived_string(archive, key), "", what.c_str());
  } else {
    static_assert(std::is_enum_v<T>, "a listed field is a number, bool, string, dtype or enum");
    field = parse_listed_enum<T>(read_archived_string(archive, key));
  }
}

/// Writes `field` under `key`: enums by their names, dtypes by torch's.
template <typename T>
void write_field(torch::serialize::OutputArchive& archive, const char* key, const T& field) {
  if constexpr (std::is_same_v<T, at::ScalarType>) {
    archive.write(key, c10::IValue(dtype_name(field)));
  } else if constexpr (std::is_enum_v<T>) {
    archive.write(key, c10::IValue(to_string(field)));
  } else {
    archive.write(key, c10::IValue(field));
  }
}

/// Mixes `field` into `digest` (a string by its length and characters);
/// lr is left out.
template <typename T>
void mix_field(SettingsDigest& digest, const char* key, const T& field) {
  if (std::strcmp(key, "lr") == 0) return;
  if constexpr (std::is_same_v<T, std::string>) {
    digest(field.size());
    for (const char c : field) digest(c);
  } else {
    digest(field);
  }
}

/// Calls `f(key, field)` for every field of listed options `o`, in order.
template <typename Self, typename O, typename F>
void for_each_field(O& o, F&& f) {
  auto fields = Self::fields(o);
  static_assert(std::tuple_size_v<decltype(fields)> == Self::kFields.size());
  std::apply(
      [&](auto&... field) {
        size_t i = 0;
        (f(Self::kFields[i++], field), ...);
      },
      fields);
}

}  // namespace muon::detail

namespace muon {

template <typename Self>
void ListedOptions<Self>::serialize(torch::serialize::InputArchive& archive) {
  detail::for_each_field<Self>(static_cast<Self&>(*this), [&](const char* key, auto& field) {
    detail::read_field(archive, key, field);
  });
}

template <typename Self>
void ListedOptions<Self>::serialize(torch::serialize::OutputArchive& archive) const {
  detail::for_each_field<Self>(static_cast<const Self&>(*this),
                               [&](const char* key, const auto& field) {
                                 detail::write_field(archive, key, field);
                               });
}

template <typename Self>
void ListedOptions<Self>::mix_settings(SettingsDigest& digest) const {
  detail::for_each_field<Self>(static_cast<const Self&>(*this),
                               [&](const char* key, const auto& field) {
                                 detail::mix_field(digest, key, field);
                               });
}

template <typename Self, size_t N>
void ListedParamState<Self, N>::serialize(torch::serialize::InputArchive& archive) {
  step_ = detail::read_archived_int(archive, "step");
  const auto buffers = static_cast<Self&>(*this).buffers();
  for (size_t i = 0; i < N; ++i)
    *buffers[i] = detail::read_optional_buffer(archive, Self::kBuffers[i]);
}

template <typename Self, size_t N>
void ListedParamState<Self, N>::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step_));
  const auto buffers = const_buffers();
  for (size_t i = 0; i < N; ++i)
    detail::write_optional_buffer(archive, Self::kBuffers[i], *buffers[i]);
}

template <typename Self, size_t N>
std::array<const at::Tensor*, N> ListedParamState<Self, N>::const_buffers() const {
  const auto buffers = const_cast<Self&>(static_cast<const Self&>(*this)).buffers();
  std::array<const at::Tensor*, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = buffers[i];
  return out;
}

template <typename Self, size_t N>
bool ListedParamState<Self, N>::equals(const Self& other) const {
  if (step_ != other.step()) return false;
  const auto a = const_buffers();
  const auto b = other.const_buffers();
  for (size_t i = 0; i < N; ++i) {
    if (!detail::same_buffer(*a[i], *b[i])) return false;
  }
  return true;
}

}  // namespace muon
