// Cutting the blocks into pipeline stages (parallel/pipeline/partition.h): even blocks split
// evenly; a heavy embedding or head pulls blocks off its stage; the cut is the best one (a
// brute-force search over every cut of small models agrees); bad input is an InputError.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "paratrain/base/error.h"
#include "paratrain/parallel/pipeline/partition.h"

using namespace paratrain;
using namespace paratrain::parallel::pipeline;

namespace {

double worst(const std::vector<StageRange>& s) {
  double w = 0;
  for (const auto& r : s) w = std::max(w, r.cost);
  return w;
}

// The smallest possible maximum stage cost, by trying every cut.
double brute_force(const std::vector<double>& c, double first, double last, int stages) {
  const int L = static_cast<int>(c.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> cuts;
  std::function<void(int, int)> rec = [&](int k, int from) {
    if (k == stages - 1) {
      std::vector<int> b = cuts;
      b.push_back(L);
      double w = 0;
      int a = 0;
      for (int s = 0; s < stages; ++s) {
        double sum = (s == 0 ? first : 0) + (s == stages - 1 ? last : 0);
        for (int i = a; i < b[s]; ++i) sum += c[i];
        w = std::max(w, sum);
        a = b[s];
      }
      best = std::min(best, w);
      return;
    }
    for (int e = from + 1; e <= L - (stages - 1 - k); ++e) {
      cuts.push_back(e);
      rec(k + 1, e);
      cuts.pop_back();
    }
  };
  rec(0, 0);
  return best;
}

TEST(PipelinePartition, EvenBlocksSplitEvenlyAndEveryBlockOnce) {
  const std::vector<double> twelve(12, 1.0);
  for (int s : {1, 2, 3, 4, 6, 12}) {
    const auto st = balance_stages(twelve, 0, 0, s);
    ASSERT_EQ(static_cast<int>(st.size()), s);
    int next = 0;
    for (const auto& r : st) {
      EXPECT_EQ(r.first_block, next);
      EXPECT_EQ(r.end_block - r.first_block, 12 / s);
      next = r.end_block;
    }
    EXPECT_EQ(next, 12);
    EXPECT_TRUE(st[0].has_embedding());
  }
  EXPECT_EQ(describe_stages(balance_stages(twelve, 0, 0, 4)), "blocks 0-2 | 3-5 | 6-8 | 9-11");
  EXPECT_EQ(describe_stages(balance_stages(std::vector<double>(2, 1.0), 0, 0, 2)), "blocks 0 | 1");
}

TEST(PipelinePartition, AHeavyEmbeddingOrHeadTakesBlocksOffItsStage) {
  // gpt2-124m by parameters: 12 blocks of 7.08M, the tied embedding 38.6M + 0.8M positions on
  // the first stage; the head is the same tensor, so nothing extra on the last.
  const std::vector<double> blocks(12, 7.08);
  const auto st = balance_stages(blocks, 39.4, 0, 4);
  EXPECT_EQ(describe_stages(st), "blocks 0 | 1-4 | 5-7 | 8-11") << "one block beside the embedding, the rest balanced";
  const auto tail = balance_stages(blocks, 0, 20, 2);
  EXPECT_LT(tail[1].end_block - tail[1].first_block, 6) << describe_stages(tail);
}

TEST(PipelinePartition, TheCutIsTheBestOne) {
  uint64_t x = 12345;
  auto rnd = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>((x >> 33) % 100 + 1);
  };
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 1 + trial % 9;
    std::vector<double> c(static_cast<size_t>(L));
    for (auto& v : c) v = rnd();
    const double first = trial % 3 == 0 ? rnd() : 0, last = trial % 4 == 0 ? rnd() : 0;
    for (int s = 1; s <= L; ++s)
      EXPECT_DOUBLE_EQ(worst(balance_stages(c, first, last, s)), brute_force(c, first, last, s))
          << "trial " << trial << " L=" << L << " stages=" << s;
  }
}

TEST(PipelinePartition, BadInputIsAnInputError) {
  EXPECT_THROW(balance_stages(std::vector<double>(4, 1.0), 0, 0, 5), InputError);  // more stages than blocks
  EXPECT_THROW(balance_stages(std::vector<double>(4, 1.0), 0, 0, 0), InputError);
  EXPECT_THROW(balance_stages({1.0, -1.0}, 0, 0, 1), InputError);
  try {
    balance_stages(std::vector<double>(2, 1.0), 0, 0, 4);
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("4 pipeline stages for a model of 2 blocks"), std::string::npos) << e.what();
  }
}

}  // namespace
