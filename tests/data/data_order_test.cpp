#include "paratrain/data/data_order.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data/temp_dir.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/random.h"

using namespace paratrain;
using namespace paratrain::data;
using paratrain::testing::error_of;
using ::testing::HasSubstr;

TEST(DataOrder, PermutationIsFisherYatesWithEpochSeed) {
  // The documented algorithm, spelled out independently.
  const int64_t n = 37;
  const uint64_t seed = 1234;
  for (int64_t epoch : {0, 1, 5}) {
    std::vector<int64_t> want(n);
    std::iota(want.begin(), want.end(), 0);
    Generator g(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1)));
    for (int64_t i = n - 1; i >= 1; --i) std::swap(want[i], want[static_cast<int64_t>(g.below(i + 1))]);
    EXPECT_EQ(epoch_permutation(n, seed, epoch), want);
  }
}

TEST(DataOrder, PermutationIsAPermutationAndDiffersPerEpochAndSeed) {
  auto p0 = epoch_permutation(1000, 7, 0);
  auto sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(p0, epoch_permutation(1000, 7, 1));
  EXPECT_NE(p0, epoch_permutation(1000, 8, 0));
  EXPECT_EQ(p0, epoch_permutation(1000, 7, 0));
  EXPECT_EQ(epoch_permutation(1, 7, 0), std::vector<int64_t>{0});
  EXPECT_TRUE(epoch_permutation(0, 7, 0).empty());
}

TEST(DataOrder, StepsUseConsecutiveSlicesOfThePermutation) {
  BatchLayout L{2, 3, 2};  // G = 12
  DataOrder o(50, L, 99);
  EXPECT_EQ(o.steps_per_epoch(), 4);  // 48 used, 2 dropped per epoch
  auto p0 = epoch_permutation(50, 99, 0);
  auto p1 = epoch_permutation(50, 99, 1);
  for (int64_t s = 0; s < 8; ++s) {
    const auto& p = s < 4 ? p0 : p1;
    const int64_t q = s % 4;
    auto all = o.global_items(s);
    ASSERT_EQ(all.size(), 12u);
    for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(all[i], p[q * 12 + i]);
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t r = 0; r < 2; ++r) {
        auto it = o.items(s, k, r);
        const int64_t j = k * 2 + r;
        ASSERT_EQ(it.size(), 2u);
        EXPECT_EQ(it[0], all[j * 2]);
        EXPECT_EQ(it[1], all[j * 2 + 1]);
      }
  }
  EXPECT_EQ(o.epoch_of_step(3), 0);
  EXPECT_EQ(o.epoch_of_step(4), 1);
}

TEST(DataOrder, LayoutIndependence) {
  // dp=4 x grad_accum=1 sees, slice by slice, what dp=1 x grad_accum=4 and dp=2 x grad_accum=2 see.
  DataOrder a(100, {3, 1, 4}, 5), b(100, {3, 4, 1}, 5), c(100, {3, 2, 2}, 5);
  for (int64_t s = 0; s < 20; ++s) {
    for (int64_t j = 0; j < 4; ++j) {
      auto ia = a.items(s, 0, j);
      auto ib = b.items(s, j, 0);
      auto ic = c.items(s, j / 2, j % 2);
      EXPECT_EQ(ia, ib);
      EXPECT_EQ(ia, ic);
    }
  }
}

TEST(DataOrder, EachEpochVisitsDistinctItems) {
  DataOrder o(30, {4, 1, 1}, 3);  // 7 steps per epoch, 2 dropped
  std::set<int64_t> seen;
  for (int64_t s = 0; s < 7; ++s)
    for (auto i : o.items(s, 0, 0)) EXPECT_TRUE(seen.insert(i).second);
  EXPECT_EQ(seen.size(), 28u);
}

TEST(DataOrder, TooFewItems) {
  auto msg = error_of<InputError>([] { DataOrder o(10, {4, 2, 2}, 1, "token file x.bin"); });
  EXPECT_THAT(msg, HasSubstr("token file x.bin has 10 examples, fewer than one global batch of 16"));
}

TEST(DataOrder, BadLayout) {
  auto msg = error_of<InputError>([] { DataOrder o(10, {0, 1, 1}, 1); });
  EXPECT_THAT(msg, HasSubstr("micro-batch 0"));
}

TEST(DataOrder, OutOfRangeRankIsInternalError) {
  DataOrder o(10, {1, 1, 2}, 1);
  EXPECT_THROW(o.items(0, 0, 2), InternalError);
  EXPECT_THROW(o.items(0, 1, 0), InternalError);
}

TEST(DataOrder, UnevenRangesCoverTheMicroStepBlock) {
  // --balance auto: ranks take ranges of sizes 5 and 1 instead of 3 and 3; together they
  // are the same items, in the same order, as the even split.
  DataOrder o(200, {3, 2, 2}, 9);
  for (int64_t s = 0; s < 12; ++s)
    for (int64_t k = 0; k < 2; ++k) {
      std::vector<int64_t> even = o.items(s, k, 0), r1 = o.items(s, k, 1);
      even.insert(even.end(), r1.begin(), r1.end());
      std::vector<int64_t> uneven = o.items_range(s, k, 0, 5), tail = o.items_range(s, k, 5, 1);
      uneven.insert(uneven.end(), tail.begin(), tail.end());
      EXPECT_EQ(even, uneven);
      EXPECT_EQ(o.items_range(s, k, 3, 3), o.items(s, k, 1));
    }
  EXPECT_THROW(o.items_range(0, 0, 4, 3), InternalError);  // beyond the 6 items of the block
  EXPECT_THROW(o.items_range(0, 0, 0, 0), InternalError);
}
