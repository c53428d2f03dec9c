#include "paratrain/parallel/load_balancer.h"

#include <gtest/gtest.h>

#include <numeric>

#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::parallel;

TEST(ProportionalSplit, FollowsSpeedsAndKeepsTheTotal) {
  EXPECT_EQ(proportional_split(8, {1, 1}), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(proportional_split(8, {3, 1}), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(proportional_split(12, {1, 2, 3}), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(proportional_split(3, {100, 1, 1}), (std::vector<int64_t>{1, 1, 1}));  // at least one each
  for (int total : {5, 7, 31, 64}) {
    auto s = proportional_split(total, {0.3, 1.7, 2.2, 0.9});
    EXPECT_EQ(std::accumulate(s.begin(), s.end(), int64_t(0)), total);
    for (auto v : s) EXPECT_GE(v, 1);
  }
  EXPECT_THROW(proportional_split(1, {1, 1}), InternalError);
  EXPECT_THROW(proportional_split(4, {1, 0}), InternalError);
}

TEST(LoadBalancer, EvenUntilMeasuredThenProportionalFromTwoStepsLater) {
  LoadBalancer b(2, 4, true, /*interval=*/3);
  EXPECT_EQ(b.sizes_at(0), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(b.first(1, 0), 4);
  EXPECT_DOUBLE_EQ(b.weight(0, 0), 1.0);
  // Rank 1 takes three times as long for the same items.
  EXPECT_FALSE(b.observe(1, {1.0, 3.0}));
  EXPECT_FALSE(b.observe(2, {1.0, 3.0}));
  EXPECT_TRUE(b.observe(3, {1.0, 3.0}));
  EXPECT_EQ(b.sizes_at(4), (std::vector<int64_t>{4, 4}));  // already being prefetched
  EXPECT_EQ(b.sizes_at(5), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(b.first(1, 5), 6);
  EXPECT_DOUBLE_EQ(b.weight(0, 5), 1.5);
  EXPECT_DOUBLE_EQ(b.weight(1, 5), 0.5);
  EXPECT_FALSE(b.observe(4, {1.0, 3.0}));  // the old split's last step is not measured
  EXPECT_EQ(b.sizes_at(4), (std::vector<int64_t>{6, 2}));  // in force (steps >= 5 in practice)
  // Balanced now: equal times, no further change.
  for (int64_t s = 5; s < 20; ++s) EXPECT_FALSE(b.observe(s, {1.5, 1.5}));
  EXPECT_EQ(b.changes(), 1);
}

TEST(LoadBalancer, SmallDifferencesAndDisabledBalancerChangeNothing) {
  LoadBalancer b(2, 4, true, 2);
  for (int64_t s = 1; s < 10; ++s) EXPECT_FALSE(b.observe(s, {1.0, 1.02}));
  LoadBalancer off(2, 4, false, 2);
  for (int64_t s = 1; s < 10; ++s) EXPECT_FALSE(off.observe(s, {1.0, 5.0}));
  EXPECT_EQ(off.sizes_at(9), (std::vector<int64_t>{4, 4}));
}
