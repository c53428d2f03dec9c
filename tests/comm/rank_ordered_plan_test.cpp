// The rank-ordered plans (comm/algorithms/rank_ordered_plan.h) that the nccl backend enqueues,
// run here on host memory for every rank at once: each step's sends must meet receives of
// the same count on their peers (one to one), and after the last step every rank must hold
// the in-order result of shm/tcp's accumulator, bit for bit (reduce_kernels.h, which is also
// the rule of the CUDA combine kernel), for group sizes 2..5 and counts that leave chunks
// uneven or empty.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "comm/algorithms/rank_ordered_plan.h"
#include "comm/algorithms/reduce_kernels.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm::algorithms {
namespace {

using Bytes = std::vector<char>;

Bytes random_f32(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-6, 6);
  Bytes b(n * 4);
  for (size_t i = 0; i < n; ++i) {
    const float f = std::ldexp(mant(gen), expo(gen));
    std::memcpy(b.data() + 4 * i, &f, 4);
  }
  return b;
}

// x_0 op ... op x_(n-1) of the first `count` elements (each rank's `x[p] + offset`).
Bytes in_order(const std::vector<Bytes>& x, size_t offset, size_t count, ReduceOp op) {
  const int n = static_cast<int>(x.size());
  std::vector<char> acc(std::max<size_t>(1, count * 4));
  Bytes out(count * 4);
  kernels::acc_load(acc.data(), x[0].data() + offset * 4, count, DType::F32);
  for (int p = 1; p < n; ++p) kernels::acc_add(acc.data(), x[p].data() + offset * 4, count, DType::F32, op);
  kernels::acc_store(out.data(), acc.data(), count, DType::F32, op, n);
  return out;
}

struct Rank {
  RankOrderedPlan plan;
  Bytes input, output, slots;
  char* at(PlanBuffer b, size_t offset) {
    Bytes& v = b == PlanBuffer::kInput ? input : b == PlanBuffer::kOutput ? output : slots;
    return v.data() + offset * 4;
  }
};

// Runs every rank's plan: a rank's combines run when it reaches them; its k-th group of
// transfers exchanges with every other rank's k-th group (the order in which NCCL runs the
// groups of one stream), and each send must meet one receive of the same count there.
// `in_place`: input and output are one buffer (allreduce, reduce), kept in `output`.
void run(std::vector<Rank>& ranks, ReduceOp op, bool in_place) {
  const int n = static_cast<int>(ranks.size());
  for (Rank& k : ranks) k.slots.assign(std::max<size_t>(1, k.plan.slot_elements) * 4, 0x5a);
  auto buffer = [&](PlanBuffer b) { return in_place && b == PlanBuffer::kInput ? PlanBuffer::kOutput : b; };
  std::vector<size_t> pc(n, 0);
  for (int round = 0;; ++round) {
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks[r];
      for (; pc[r] < k.plan.steps.size() && k.plan.steps[pc[r]].combines; ++pc[r]) {
        const Combine c = k.plan.steps[pc[r]].combine;
        const char* own = k.at(buffer(PlanBuffer::kInput), c.own_offset);
        std::vector<char> acc(std::max<size_t>(1, c.count * 4));
        for (int p = 0; p < n; ++p) {
          const char* x = p == r ? own : k.slots.data() + (p * c.slot_stride) * 4;
          if (p == 0) kernels::acc_load(acc.data(), x, c.count, DType::F32);
          else kernels::acc_add(acc.data(), x, c.count, DType::F32, op);
        }
        kernels::acc_store(k.at(PlanBuffer::kOutput, c.out_offset), acc.data(), c.count, DType::F32, op, n);
      }
    }
    // This round's messages, keyed by (from, to), taken before any receive.
    std::map<std::pair<int, int>, Bytes> sent;
    bool any = false;
    for (int r = 0; r < n; ++r) {
      if (pc[r] == ranks[r].plan.steps.size()) continue;
      any = true;
      for (const Transfer& t : ranks[r].plan.steps[pc[r]].sends) {
        ASSERT_NE(t.peer, r);
        ASSERT_GT(t.count, 0u) << "an empty transfer was kept";
        ASSERT_EQ(sent.count({r, t.peer}), 0u) << "rank " << r << " sends twice to " << t.peer << " in one group";
        const char* src = ranks[r].at(buffer(t.buffer), t.offset);
        sent[{r, t.peer}] = Bytes(src, src + t.count * 4);
      }
    }
    if (!any) return;
    size_t received = 0;
    for (int r = 0; r < n; ++r) {
      if (pc[r] == ranks[r].plan.steps.size()) continue;
      for (const Transfer& t : ranks[r].plan.steps[pc[r]].recvs) {
        auto it = sent.find({t.peer, r});
        ASSERT_NE(it, sent.end()) << "group " << round << ": rank " << r << " waits for rank " << t.peer
                                  << ", which sends it nothing";
        ASSERT_EQ(it->second.size(), t.count * 4) << "group " << round << ": counts differ between " << t.peer
                                                  << " and " << r;
        std::memcpy(ranks[r].at(buffer(t.buffer), t.offset), it->second.data(), it->second.size());
        ++received;
      }
      ++pc[r];
    }
    ASSERT_EQ(received, sent.size()) << "group " << round << ": a message is never received";
  }
}

const size_t kCounts[] = {0, 1, 3, 4, 7, 1000, 1001};

TEST(RankOrderedPlan, AllreduceGivesEveryRankTheInOrderBits) {
  for (int n = 2; n <= 5; ++n)
    for (size_t count : kCounts)
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        SCOPED_TRACE(::testing::Message() << n << " ranks, " << count << " elements, op " << int(op));
        std::vector<Bytes> x;
        for (int p = 0; p < n; ++p) x.push_back(random_f32(count, 10u * n + p + 7u * count));
        std::vector<Rank> ranks(n);
        for (int r = 0; r < n; ++r) ranks[r] = {rank_ordered_allreduce_plan(n, r, count), {}, x[r], {}};
        run(ranks, op, true);
        const Bytes want = in_order(x, 0, count, op);
        for (int r = 0; r < n; ++r) EXPECT_TRUE(ranks[r].output == want) << "rank " << r;
      }
}

TEST(RankOrderedPlan, ReduceScatterGivesEachRankItsBlock) {
  for (int n = 2; n <= 5; ++n)
    for (size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << n << " ranks, " << count << " elements per block");
      std::vector<Bytes> x;
      for (int p = 0; p < n; ++p) x.push_back(random_f32(count * n, 3u * n + p + count));
      std::vector<Rank> ranks(n);
      for (int r = 0; r < n; ++r) ranks[r] = {rank_ordered_reduce_scatter_plan(n, r, count), x[r], Bytes(count * 4), {}};
      run(ranks, ReduceOp::kSum, false);
      for (int r = 0; r < n; ++r) EXPECT_TRUE(ranks[r].output == in_order(x, r * count, count, ReduceOp::kSum)) << "rank " << r;
    }
}

TEST(RankOrderedPlan, ReduceGivesTheRootTheInOrderBitsAndLeavesTheOthers) {
  for (int n = 2; n <= 5; ++n)
    for (int root : {0, n - 1})
      for (size_t count : kCounts) {
        SCOPED_TRACE(::testing::Message() << n << " ranks, root " << root << ", " << count << " elements");
        std::vector<Bytes> x;
        for (int p = 0; p < n; ++p) x.push_back(random_f32(count, 5u * n + p + count));
        std::vector<Rank> ranks(n);
        for (int r = 0; r < n; ++r) ranks[r] = {rank_ordered_reduce_plan(n, r, count, root), {}, x[r], {}};
        run(ranks, ReduceOp::kSum, true);
        for (int r = 0; r < n; ++r)
          EXPECT_TRUE(ranks[r].output == (r == root ? in_order(x, 0, count, ReduceOp::kSum) : x[r])) << "rank " << r;
      }
}

}  // namespace
}  // namespace paratrain::comm::algorithms
