#pragma once
// Expects a c10::ValueError whose message contains every one of `parts`
// (the argument's name, its value, the valid choices...).
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace muon::test {

inline void expect_value_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const c10::ValueError& e) {
    const std::string msg = e.what_without_backtrace();
    for (const auto& part : parts) {
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    }
  }
}

/// The message (without backtrace) of the E that `f` throws; "" when it
/// throws none, so that any expectation on the message fails.
template <typename E = c10::ValueError, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace muon::test
