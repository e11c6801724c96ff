#pragma once

/// How an optimizer's options say, cheaply, what settings they hold: the
/// distributed step agreement (muon/distributed/layouts/layout.h) compares a digest
/// of every param group's settings across ranks before every step.
///
/// The options of this library's optimizers implement `DigestibleOptions`;
/// a new optimizer's options do the same and need no change elsewhere:
///
///     struct MyOptions : torch::optim::OptimizerCloneableOptions<MyOptions>,
///                        muon::DigestibleOptions {
///       void mix_settings(muon::SettingsDigest& d) const override { d(beta1(), eps(), weight_decay()); }
///       ...
///     };
///
/// Options of another type are compared by their type and learning rate
/// only (LibTorch's Adam, AdamW and SGD by every field).
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace muon {

/// A running FNV-1a digest of the bytes of trivially copyable values.
class SettingsDigest {
 public:
  /// Mixes each value in, in order.
  template <typename... T>
  void operator()(const T&... values) {
    (add(values), ...);
  }
  /// The digest so far.
  uint64_t value() const { return hash_; }

 private:
  template <typename T>
  void add(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>, "SettingsDigest mixes trivially copyable values");
    const auto* bytes = reinterpret_cast<const unsigned char*>(&v);
    for (size_t i = 0; i < sizeof(T); ++i) {
      hash_ ^= bytes[i];
      hash_ *= 1099511628211ULL;
    }
  }

  uint64_t hash_ = 1469598103934665603ULL;
};

/// Options that mix every setting that changes a step into a digest (see
/// the top of this header). The learning rate and the options' type are
/// mixed by the caller.
class DigestibleOptions {
 public:
  virtual ~DigestibleOptions() = default;
  /// Mixes every field that changes the step, lr aside, into `digest`.
  virtual void mix_settings(SettingsDigest& digest) const = 0;
};

}  // namespace muon
