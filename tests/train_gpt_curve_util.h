#pragma once
// Two of muon-train-gpt's curves (its CSV logs) compared, for the tests
// that check a layout, a world size or a restart against another run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "report.h"

namespace train_gpt_test {

/// The largest relative difference of two runs' validation and training
/// losses at every logged step. The logged steps and their token counts
/// must be the same (a step lost or counted twice changes them).
inline double largest_difference(const train_gpt::RunLog& a, const train_gpt::RunLog& b) {
  EXPECT_EQ(a.points.size(), b.points.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.points.size(), b.points.size()); ++i) {
    EXPECT_EQ(a.points[i].step, b.points[i].step);
    EXPECT_EQ(a.points[i].tokens, b.points[i].tokens);
    worst = std::max(worst, std::abs(a.points[i].valid_loss - b.points[i].valid_loss) /
                                std::abs(a.points[i].valid_loss));
    if (i > 0) {
      worst = std::max(worst, std::abs(a.points[i].train_loss - b.points[i].train_loss) /
                                  std::abs(a.points[i].train_loss));
    }
  }
  return worst;
}

}  // namespace train_gpt_test
