// One-line errors for rendezvous failures: c10's exceptions carry a C++
// backtrace in what(); a rank that waited in vain should print one line
// that says what to check, not twenty frames.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <exception>
#include <string>

#include "util/names.h"

namespace muon::dist::detail {

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
/// message itself (c10 appends one newline).
[[noreturn]] inline void throw_without_backtrace(const std::string& message) {
  throw c10::Error(message, /*backtrace=*/"");
}

}  // namespace muon::dist::detail
