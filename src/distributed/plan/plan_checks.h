#pragma once

// muon::plan's input ranges and checked arithmetic (src/distributed/plan/): every
// count the planner multiplies is an int64 checked against overflow, every
// input is refused outside the ranges below (docs/scale.md#input-ranges) in
// one line naming the field and its value, so that no prediction holds a
// wrapped count, a negative, an inf or a NaN.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "muon/plan.h"

namespace muon::plan::detail {

/// World sizes, ranks per node, tensor-parallel sizes: at most 2^20.
constexpr int64_t kMaxRanks = int64_t{1} << 20;
/// A model's tensors (each "count" expanded): at most 2^18.
constexpr int64_t kMaxTensors = int64_t{1} << 18;
/// A tensor's and a whole model's elements: at most 2^50.
constexpr int64_t kMaxElements = int64_t{1} << 50;
/// Integer fields without a tighter bound: at most 2^53 (exact in JSON).
constexpr int64_t kMaxCount = int64_t{1} << 53;
/// The planner's work, tensors × world, per prediction: at most 2^18.
constexpr int64_t kMaxWork = int64_t{1} << 18;
/// FLOP/s, bytes/s, seconds, bytes and FLOPs: finite, within these.
constexpr double kMinRate = 1, kMaxFlopRate = 1e24, kMaxByteRate = 1e18;
constexpr double kMaxSeconds = 1e3, kMaxMemory = 1e18, kMaxFlops = 1e36;

/// An int64 the planner cannot hold: `what` names the quantity. predict()
/// turns it into a ValueError naming the model, layout and world.
class Overflow : public std::overflow_error {
 public:
  explicit Overflow(const std::string& what) : std::overflow_error(what) {}
};

/// a · b and a + b, or Overflow naming `what`.
int64_t mul(int64_t a, int64_t b, const char* what);
int64_t add(int64_t a, int64_t b, const char* what);
/// `total` split into `parts` as muon::distributed::balanced_split_sizes does: the
/// size of part `index`, without the vector.
int64_t balanced_part(int64_t total, int64_t parts, int64_t index);

/// Group::bytes_sent's ring model: an all-reduce of `bytes` over p ranks
/// sends 2(p−1)·bytes/p (rounded down) from each; an all-gather of `bytes`
/// from each rank (p−1)·bytes.
int64_t ring_all_reduce_bytes(int64_t bytes, int64_t p);
int64_t all_gather_bytes(int64_t bytes, int64_t p);

/// A name or value as a message shows it: at most 80 characters, control
/// characters as '?', so that a refusal stays one bounded line.
std::string shown(const std::string& s);

/// Refuse (c10::ValueError, one line naming the field and its value) what
/// lies outside the ranges above.
void check_options(const Options& o);
void check_machine(const Machine& m);
void check_model(const Model& m);

/// The planner itself (plan.cpp), on inputs already checked; throws
/// Overflow where a count does not fit.
Prediction predict_unchecked(const Model& model, const Machine& machine, LayoutKind layout, const Options& options);

/// Refuse a prediction holding a non-finite or negative figure (only
/// throughput_cost may be negative: Muon's step cheaper than AdamW's).
void check_finite(const Prediction& p, const Model& model, const Machine& machine);

}  // namespace muon::plan::detail
