#pragma once

/// Text from the command line in muon-train-gpt's messages.
#include <cstddef>
#include <string>

namespace train_gpt {

/// `text`, cut to at most `max` characters (ending in "...") for a message.
inline std::string clip(const std::string& text, size_t max = 200) {
  return text.size() <= max ? text : text.substr(0, max - 3) + "...";
}

}  // namespace train_gpt
