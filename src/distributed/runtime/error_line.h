// One-line errors for rendezvous failures: c10's exceptions carry a C++
// backtrace in what(); a rank that waited in vain should print one line
// that says what to check, not twenty frames.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <exception>
#include <string>
#include <type_traits>

#include "util/names.h"

namespace muon::distributed::detail {

/// Longest cause quoted from a lower layer's message.
constexpr std::size_t kMaxCauseChars = 200;

/// The first line of `e`'s message without c10's backtrace, clipped to
/// `max_chars` bytes (muon::detail::clip).
inline std::string first_line(const std::exception& e, std::size_t max_chars = kMaxCauseChars) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  const auto nl = text.find_first_of("\r\n");
  if (nl != std::string::npos) text.resize(nl);
  return muon::detail::clip(text, max_chars);
}

/// Throws c10::Error with `message` and no backtrace: its what() is the
/// message itself (c10 appends one newline). LibTorch 1.13 takes the
/// backtrace as a string (empty: none); 2.x as a lazily computed value
/// (null: none), the default.
template <typename E = c10::Error>
[[noreturn]] void throw_without_backtrace(const std::string& message) {
  if constexpr (std::is_constructible_v<E, std::string, std::string>) {
    throw E(message, std::string());
  } else {
    throw E(message);
  }
}

}  // namespace muon::distributed::detail
