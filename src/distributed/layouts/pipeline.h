// The layouts' one overlap pipeline: stages (buckets, batches) whose
// collectives travel while earlier stages are finished, in order, with a
// bound on how many are in flight. Used by ShardedDataParallel (gradient
// reduce-scatter, parameter all-gather), LayerwiseOptimizer (owners'
// all-gathers) and ShardedOrthogonalizer (owner-compute's two legs). Internal.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

#include "muon/distributed/runtime/group.h"

namespace muon::distributed::detail {

/// Stages whose collectives are in flight, oldest first. `push(i, pending)`
/// adds stage i, then finishes the oldest stages while more than `depth` are
/// in flight; `drain` finishes the rest. Finishing a stage waits for its
/// collective and calls `finish(i, results)` (results: every rank's tensor,
/// empty when the stage had nothing to exchange). Stages finish in the order
/// they were pushed.
///
/// Left by an exception (from a start, a finish or a wait), the pipeline
/// waits for every collective still in flight, oldest first, and drops their
/// results without finishing their stages: no rank leaves a collective it
/// started behind, and no stage is applied in part.
template <typename Finish>
class Pipeline {
 public:
  Pipeline(size_t depth, Finish finish) : depth_(depth), finish_(std::move(finish)) {}
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  ~Pipeline() {
    // PendingCollective waits in its destructor and drops the error.
    while (!in_flight_.empty()) in_flight_.pop_front();
  }

  void push(size_t stage, PendingCollective pending) {
    in_flight_.emplace_back(stage, std::move(pending));
    while (in_flight_.size() > depth_) finish_oldest();
  }

  void drain() {
    while (!in_flight_.empty()) finish_oldest();
  }

 private:
  void finish_oldest() {
    auto [stage, pending] = std::move(in_flight_.front());
    in_flight_.pop_front();
    finish_(stage, pending.valid() ? pending.wait() : std::vector<at::Tensor>{});
  }

  size_t depth_;
  Finish finish_;
  std::deque<std::pair<size_t, PendingCollective>> in_flight_;
};

/// Runs stages 0..count-1: `start(i)` does stage i's work and returns its
/// collective (a PendingCollective, invalid when there is nothing to
/// exchange), `finish(i, results)` uses what it brought. Stage i + depth is
/// started before stage i is finished, so up to depth + 1 collectives travel
/// at once (depth 0: one at a time). Exceptions as in Pipeline.
template <typename Start, typename Finish>
void run_pipeline(size_t count, size_t depth, const Start& start, const Finish& finish) {
  Pipeline<const Finish&> pipeline(depth, finish);
  for (size_t i = 0; i < count; ++i) pipeline.push(i, start(i));
  pipeline.drain();
}

}  // namespace muon::distributed::detail
