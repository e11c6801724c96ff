#pragma once

/// The names an optimizer of the library goes by, declared together:
///
///   static constexpr OptimizerNames kNames{"muon::Lion", "lion"};
///
/// `kind` is what its messages say ("[muon::Lion] ..."), the kind its
/// archive records and checks on load, and with "Options" its options'
/// name; `prefix` starts its archive keys ("lion_groups",
/// "lion_options/<i>", "lion_group_size/<i>"). muon::ElementwiseOptimizer
/// and muon::WholeMatrixOptimizer read them from their derived class.

namespace muon {

/// An optimizer's kind ("muon::Lion") and archive-key prefix ("lion").
struct OptimizerNames {
  const char* kind;
  const char* prefix;
};

}  // namespace muon
