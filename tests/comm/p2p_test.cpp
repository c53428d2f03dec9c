// Non-blocking send/recv (process_group.h's point-to-point contract) with one thread per
// rank, over shm and tcp: posting order never matters, FIFO per tag, tags independent, p2p
// in flight while collectives run, dtype/count mismatches and deadlines named.
#include <gtest/gtest.h>

#include <algorithm>
#include <latch>
#include <random>
#include <thread>

#include "comm/comm_check.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::comm;
using namespace paratrain::comm::testing;

namespace {

// Element i of message k from src to dst.
int32_t val(int src, int dst, int k, size_t i) {
  return int32_t(uint32_t(i) * 2654435761u ^ uint32_t(src * 1000003 + dst * 7919 + k * 131));
}
std::vector<int32_t> message(int src, int dst, int k, size_t count) {
  std::vector<int32_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = val(src, dst, k, i);
  return v;
}
size_t wrong(const std::vector<int32_t>& got, int src, int dst, int k) {
  size_t w = 0;
  for (size_t i = 0; i < got.size(); ++i) w += got[i] != val(src, dst, k, i);
  return w;
}

ProcessGroupOptions options(const char* backend, double timeout_s = 60) {
  ProcessGroupOptions o;
  o.backend = backend;
  o.timeout_s = timeout_s;
  return o;
}

template <typename Fn>
void run_ranks(int n, const ProcessGroupOptions& o, Fn fn) {
  auto errors = run_thread_ranks(n, o, [&](int r, std::shared_ptr<ProcessGroup>& pg) { fn(r, *pg); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

class P2pThreads : public ::testing::TestWithParam<const char*> {};

// Both ranks post their recv before their send (and then wait for both), 8 MiB each way.
TEST_P(P2pThreads, RecvFirstThenSendBothWays) {
  const size_t count = 2u << 20;
  run_ranks(2, options(GetParam()), [&](int r, ProcessGroup& pg) {
    const int peer = 1 - r;
    auto out = message(r, peer, 0, count);
    std::vector<int32_t> in(count, 0);
    auto v = pg.recv(in.data(), count, DType::I32, peer, 0);
    auto s = pg.send(out.data(), count, DType::I32, peer, 0);
    v->wait();
    s->wait();
    EXPECT_EQ(wrong(in, peer, r, 0), 0u) << "rank " << r;
  });
}

// Messages on one tag arrive in the order they were sent, eager and rendezvous ones mixed
// (their sizes alternate, so a reordering would also be a count mismatch).
TEST_P(P2pThreads, MessagesOnOneTagStayInOrder) {
  const std::vector<size_t> counts = {1000, 300000, 0, 1000, 300000, 17, 300000, 1000};
  run_ranks(2, options(GetParam()), [&](int r, ProcessGroup& pg) {
    std::vector<std::vector<int32_t>> bufs;
    std::vector<WorkPtr> works;
    for (size_t k = 0; k < counts.size(); ++k) {
      if (r == 0) {
        bufs.push_back(message(0, 1, int(k), counts[k]));
        works.push_back(pg.send(bufs.back().data(), counts[k], DType::I32, 1, 3));
      } else {
        bufs.emplace_back(counts[k], 0);
      }
    }
    if (r == 1)
      for (size_t k = 0; k < counts.size(); ++k) works.push_back(pg.recv(bufs[k].data(), counts[k], DType::I32, 0, 3));
    for (auto& w : works) w->wait();
    if (r == 1)
      for (size_t k = 0; k < counts.size(); ++k) EXPECT_EQ(wrong(bufs[k], 0, 1, int(k)), 0u) << "message " << k;
  });
}

// A recv on one tag completes while an earlier message on another tag is still unmatched:
// the receiver waits for tag 3, then 2, then 1, the sender sent 1, 2, 3 (large, small,
// large), so the large one on tag 1 must not hold the others back.
TEST_P(P2pThreads, TagsMatchIndependently) {
  const size_t counts[3] = {1u << 20, 100, 1u << 20};
  run_ranks(2, options(GetParam()), [&](int r, ProcessGroup& pg) {
    if (r == 0) {
      std::vector<std::vector<int32_t>> out;
      std::vector<WorkPtr> works;
      for (int k = 0; k < 3; ++k) {
        out.push_back(message(0, 1, k, counts[k]));
        works.push_back(pg.send(out.back().data(), counts[k], DType::I32, 1, k + 1));
      }
      for (auto& w : works) w->wait();
    } else {
      for (int k = 2; k >= 0; --k) {
        std::vector<int32_t> in(counts[k], 0);
        pg.recv(in.data(), counts[k], DType::I32, 0, k + 1)->wait();
        EXPECT_EQ(wrong(in, 0, 1, k), 0u) << "tag " << k + 1;
      }
    }
  });
}

// Every rank sends 3 messages (eager, one slot, several rings) to every other rank and posts
// all its sends and recvs in its own random order before waiting for any.
TEST_P(P2pThreads, AllPairsInAnyPostingOrder) {
  const int n = 4;
  const size_t counts[3] = {50, 200000, 1500000};
  run_ranks(n, options(GetParam()), [&](int r, ProcessGroup& pg) {
    struct Item {
      bool send;
      int peer, k;
    };
    std::vector<Item> items;
    for (int p = 0; p < n; ++p)
      if (p != r)
        for (int k = 0; k < 3; ++k) items.push_back({true, p, k}), items.push_back({false, p, k});
    std::mt19937 gen(77 + r);
    std::shuffle(items.begin(), items.end(), gen);
    std::vector<std::vector<int32_t>> bufs;
    bufs.reserve(items.size());
    std::vector<WorkPtr> works;
    for (auto& it : items) {
      if (it.send) {
        bufs.push_back(message(r, it.peer, it.k, counts[it.k]));
        works.push_back(pg.send(bufs.back().data(), counts[it.k], DType::I32, it.peer, it.k));
      } else {
        bufs.emplace_back(counts[it.k], 0);
        works.push_back(pg.recv(bufs.back().data(), counts[it.k], DType::I32, it.peer, it.k));
      }
    }
    for (auto& w : works) w->wait();
    for (size_t i = 0; i < items.size(); ++i)
      if (!items[i].send)
        EXPECT_EQ(wrong(bufs[i], items[i].peer, r, items[i].k), 0u)
            << "rank " << r << " from " << items[i].peer << " message " << items[i].k;
  });
}

// Collectives of the same group run while a large send is in flight (rank 1 receives only
// after the allreduce, which rank 0 issued after its send), and a send starts only after
// the calls before it: it sends what the allreduce before it wrote, without a wait between.
TEST_P(P2pThreads, CollectivesRunWhileSendsAreInFlight) {
  const size_t big = 4u << 20;
  run_ranks(2, options(GetParam()), [&](int r, ProcessGroup& pg) {
    std::vector<int32_t> out = message(0, 1, 0, big), in(big, 0);
    std::vector<float> x(100000, float(r + 1));
    if (r == 0) {
      auto s = pg.send(out.data(), big, DType::I32, 1, 9);
      pg.allreduce(x.data(), x.size(), DType::F32)->wait();
      pg.barrier()->wait();
      s->wait();
    } else {
      pg.allreduce(x.data(), x.size(), DType::F32)->wait();
      pg.barrier()->wait();
      pg.recv(in.data(), big, DType::I32, 0, 9)->wait();
      EXPECT_EQ(wrong(in, 0, 1, 0), 0u);
    }
    EXPECT_EQ(x[99999], 3.f);
    // allreduce then send of its result, no wait in between.
    std::vector<float> y(300000, float(r + 1)), got(y.size(), 0.f);
    WorkPtr a = pg.allreduce(y.data(), y.size(), DType::F32);
    WorkPtr s = pg.send(y.data(), y.size(), DType::F32, 1 - r, 10);
    WorkPtr v = pg.recv(got.data(), got.size(), DType::F32, 1 - r, 10);
    a->wait();
    s->wait();
    v->wait();
    EXPECT_EQ(got[0], 3.f);
    EXPECT_EQ(got[299999], 3.f);
  });
}

// Rendezvous and eager messages whose recv disagrees on the count: the recv fails naming
// both sides; the sender of the large one is told too (it does not wait for its deadline).
TEST_P(P2pThreads, CountMismatchIsNamed) {
  std::vector<std::string> errs(2);
  std::latch both(2);
  auto errors = run_thread_ranks(2, options(GetParam(), 30), [&](int r, std::shared_ptr<ProcessGroup>& pg) {
    std::vector<int32_t> buf(300000, 0);
    try {
      if (r == 0) pg->send(buf.data(), 300000, DType::I32, 1, 4)->wait();
      else pg->recv(buf.data(), 200000, DType::I32, 0, 4)->wait();
    } catch (const CommError& e) {
      errs[r] = e.what();
    }
    both.arrive_and_wait();
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errs[1].find("recv #0 (i32 x 200000"), std::string::npos) << errs[1];
  EXPECT_NE(errs[1].find("i32 x 300000"), std::string::npos) << errs[1];
  EXPECT_NE(errs[0].find("send #0 (i32 x 300000"), std::string::npos) << errs[0];
  EXPECT_NE(errs[0].find("expects i32 x 200000"), std::string::npos) << errs[0];
}

INSTANTIATE_TEST_SUITE_P(Comm, P2pThreads, ::testing::Values("shm", "tcp"));

// A recv nobody sends to and a send nobody receives fail at their deadline, naming the
// rank, the operation, its sequence number, peer, tag and bytes, and the group is unusable
// afterwards. The ranks stay in the group until both failed (a rank that left would be
// named as having left instead).
TEST(P2pDeadline, UnmatchedRecvAndSendTimeOutNamingOpPeerTag) {
  std::vector<std::string> errs(2);
  std::vector<double> took(2);
  std::latch both(2);
  auto errors = run_thread_ranks(2, options("shm", 2.0), [&](int r, std::shared_ptr<ProcessGroup>& pg) {
    std::vector<int32_t> buf(1u << 18, 0);
    pg->barrier()->wait();
    auto t0 = std::chrono::steady_clock::now();
    try {
      if (r == 0) pg->send(buf.data(), buf.size(), DType::I32, 1, 5)->wait();  // 1 MiB: needs its recv
      else pg->recv(buf.data(), 10, DType::I32, 0, 6)->wait();
    } catch (const TimeoutError& e) {
      errs[r] = e.what();
    }
    took[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    both.arrive_and_wait();
    EXPECT_THROW(pg->barrier()->wait(), CommError);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(errs[0].find("rank 0: send #1 (i32 x 262144, 1048576 bytes, to rank 1, tag 5) passed its deadline of 2 s"),
            std::string::npos)
      << errs[0];
  EXPECT_NE(errs[0].find("rank 1 has not posted the matching recv"), std::string::npos) << errs[0];
  EXPECT_NE(errs[1].find("rank 1: recv #1 (i32 x 10, 40 bytes, from rank 0, tag 6) passed its deadline of 2 s"),
            std::string::npos)
      << errs[1];
  EXPECT_NE(errs[1].find("rank 0 sent no message with this tag"), std::string::npos) << errs[1];
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(took[r], 2.0) << "rank " << r;
    EXPECT_LT(took[r], 30.0) << "rank " << r;  // a hang bound
  }
}

}  // namespace
