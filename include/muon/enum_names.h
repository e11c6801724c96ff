#pragma once

/// The names of the library's enums.
///
/// Every enum a user can name in a config, on a command line or from Python
/// (WeightDecayMode, Route, NonFinitePolicy, ...) has the same two functions,
/// declared by one line beside the enum:
///
///   MUON_ENUM_NAMES(WeightDecayMode, parse_weight_decay_mode);
///
/// declares `std::string to_string(WeightDecayMode value)`, the value's name,
/// and `WeightDecayMode parse_weight_decay_mode(const std::string& name)`, its
/// inverse: an unknown name raises c10::ValueError naming it and listing the
/// valid names. The comment above each use lists the names. Both functions
/// read one table of values and names in the library, so they cannot
/// disagree.
#include <string>

#define MUON_ENUM_NAMES(Type, parse_fn) \
  std::string to_string(Type value);    \
  Type parse_fn(const std::string& name)
