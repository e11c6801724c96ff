// Names of options and modes: joining lists for messages, parsing an enum
// from its name with one error format for the whole library, and clipping
// user input echoed in messages.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace muon::detail {

/// `text` as echoed in a message: whole when at most `max` bytes, else its
/// first `max` bytes (not ending inside a UTF-8 sequence) followed by
/// "… (N bytes)". Error messages echo user input (keys, values, names,
/// patterns, labels) through it, so their length stays bounded whatever the
/// input.
inline std::string clip(const std::string& text, std::size_t max = 80) {
  if (text.size() <= max) return text;
  std::size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "\u2026 (" + std::to_string(text.size()) + " bytes)";
}

/// The items of `items`, each converted with `to_text`, separated by `sep`.
template <typename Range, typename ToText>
std::string join(const Range& items, ToText to_text, const char* sep = ", ") {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += sep;
    out += to_text(item);
    first = false;
  }
  return out;
}

/// The strings of `items` separated by `sep`.
template <typename Range>
std::string join(const Range& items, const char* sep = ", ") {
  return join(items, [](const auto& s) { return std::string(s); }, sep);
}

/// "[a, b, c]": a shape (or any list of sizes) in messages.
inline std::string shape_text(const std::vector<int64_t>& shape) {
  return "[" + join(shape, [](int64_t d) { return std::to_string(d); }) + "]";
}

/// One enum value and its name: a row of the table an enum's `to_string`
/// and parser both read, so the two cannot disagree.
template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

/// The name of `value` in `names`.
template <typename Enum, std::size_t N>
std::string name_of(Enum value, const EnumName<Enum> (&names)[N]) {
  for (const auto& n : names) {
    if (n.value == value) return n.name;
  }
  TORCH_INTERNAL_ASSERT(false, "an enum value without a name: ", static_cast<int>(value));
}

/// Every name in `names`, in table order.
template <typename Enum, std::size_t N>
std::vector<std::string> names_of(const EnumName<Enum> (&names)[N]) {
  std::vector<std::string> out;
  for (const auto& n : names) out.emplace_back(n.name);
  return out;
}

/// The value named `name` in `names`; otherwise raises c10::ValueError
/// "<who>unknown <what> '<name>'; valid names: a, b, c".
template <typename Enum, std::size_t N>
Enum parse_name(const std::string& name, const EnumName<Enum> (&names)[N], const char* who,
                const char* what) {
  for (const auto& n : names) {
    if (name == n.name) return n.value;
  }
  TORCH_CHECK_VALUE(false, who, "unknown ", what, " '", clip(name), "'; valid names: ",
                    join(names, [](const EnumName<Enum>& n) { return std::string(n.name); }));
}

/// Defines the two functions MUON_ENUM_NAMES declares (muon/enum_names.h)
/// from one table `names` of EnumName<Type>: `to_string` by name_of, and
/// `parse_fn` by parse_name, whose error says "<who>unknown <what> '<name>';
/// valid names: ...". Written where the declaration's namespace is open, with a
/// `;` after it.
#define MUON_DEFINE_ENUM_NAMES(Type, parse_fn, names, who, what)                                        \
  std::string to_string(Type value) { return ::muon::detail::name_of(value, names); }                   \
  Type parse_fn(const std::string& name) { return ::muon::detail::parse_name(name, names, who, what); } \
  static_assert(true, "MUON_DEFINE_ENUM_NAMES(...) is followed by ;")

/// Whether `name` is one of `names`; otherwise raises the same error as
/// parse_name, listing `names`.
inline void check_name(const std::string& name, const std::vector<std::string>& names,
                       const char* who, const char* what) {
  for (const auto& n : names) {
    if (n == name) return;
  }
  TORCH_CHECK_VALUE(false, who, "unknown ", what, " '", clip(name), "'; valid names: ", join(names));
}

}  // namespace muon::detail
