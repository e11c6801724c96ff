// The layouts' overlap pipeline (src/distributed/layouts/pipeline.h): stages start
// `depth` ahead of the one finished, finish in order, and an exception
// leaves no stage finished in part.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/layouts/pipeline.h"
#include "muon/distributed/runtime/group.h"

namespace muon::distributed::test {
namespace {

// A one-rank group: its collectives complete at once, so the order of
// starts and finishes is the pipeline's alone.
PendingCollective gather(const Group& group, size_t stage) {
  return group.all_gather_async(at::full({1}, static_cast<double>(stage), at::kDouble));
}

std::vector<std::string> trace(size_t stages, size_t depth) {
  const auto group = Group::single();
  std::vector<std::string> events;
  detail::run_pipeline(
      stages, depth,
      [&](size_t i) {
        events.push_back("s" + std::to_string(i));
        return gather(group, i);
      },
      [&](size_t i, const std::vector<at::Tensor>& results) {
        EXPECT_EQ(results.size(), 1U);
        EXPECT_EQ(results.at(0).item<double>(), static_cast<double>(i));
        events.push_back("f" + std::to_string(i));
      });
  return events;
}

TEST(Pipeline, StartsDepthStagesAheadAndFinishesInOrder) {
  using V = std::vector<std::string>;
  EXPECT_EQ(trace(3, 0), (V{"s0", "f0", "s1", "f1", "s2", "f2"}));
  EXPECT_EQ(trace(3, 1), (V{"s0", "s1", "f0", "s2", "f1", "f2"}));
  EXPECT_EQ(trace(4, 2), (V{"s0", "s1", "s2", "f0", "s3", "f1", "f2", "f3"}));
  EXPECT_EQ(trace(2, 5), (V{"s0", "s1", "f0", "f1"}));
  EXPECT_TRUE(trace(0, 1).empty());
}

TEST(Pipeline, AStageWithNothingToExchangeFinishesWithNoResults) {
  std::vector<size_t> sizes;
  detail::run_pipeline(
      2, 1, [](size_t) { return PendingCollective(); },
      [&](size_t, const std::vector<at::Tensor>& results) { sizes.push_back(results.size()); });
  EXPECT_EQ(sizes, (std::vector<size_t>{0, 0}));
}

TEST(Pipeline, AnErrorLeavesTheStagesInFlightUnfinished) {
  const auto group = Group::single();
  std::vector<size_t> finished;
  size_t started = 0;
  // Stage 1 fails while stages 2 and 3 travel: they are waited for, never
  // finished, and the error reaches the caller.
  EXPECT_THROW(detail::run_pipeline(
                   5, 2,
                   [&](size_t i) {
                     ++started;
                     return gather(group, i);
                   },
                   [&](size_t i, const std::vector<at::Tensor>&) {
                     if (i == 1) throw std::runtime_error("stage 1");
                     finished.push_back(i);
                   }),
               std::runtime_error);
  EXPECT_EQ(finished, (std::vector<size_t>{0}));
  EXPECT_EQ(started, 4U);
  // A failing start: the stages already started are not finished either.
  finished.clear();
  EXPECT_THROW(detail::run_pipeline(
                   4, 2,
                   [&](size_t i) {
                     if (i == 2) throw std::runtime_error("start 2");
                     return gather(group, i);
                   },
                   [&](size_t i, const std::vector<at::Tensor>&) { finished.push_back(i); }),
               std::runtime_error);
  EXPECT_TRUE(finished.empty());
}

}  // namespace
}  // namespace muon::distributed::test
