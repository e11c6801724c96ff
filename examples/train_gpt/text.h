#pragma once

/// Text from the command line in muon-train-gpt's messages.
#include <cstddef>
#include <string>

namespace train_gpt {

/// `text`, cut to at most `max` characters (ending in "...") for a message.
inline std::string clip(const std::string& text, size_t max = 200) {
  return text.size() <= max ? text : text.substr(0, max - 3) + "...";
}

/// An error as one line of output: its lines joined, trailing blanks dropped.
inline std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (auto& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

}  // namespace train_gpt
