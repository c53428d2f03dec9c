// ProcessGroup with one thread per rank in this process (fast coverage of every op, dtype,
// world size and the multi-segment paths), over the shm and tcp transports.
#include <gtest/gtest.h>

#include <thread>

#include "comm/comm_check.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::comm;
using namespace paratrain::comm::testing;

namespace {

// Runs fn(pg) on n thread ranks (comm_check.h's run_thread_ranks); every rank must succeed.
template <typename Fn>
void run_ranks(int n, ProcessGroupOptions opts, Fn fn) {
  auto errors = run_thread_ranks(n, opts, [&](int, std::shared_ptr<ProcessGroup>& pg) { fn(*pg); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

struct Param {
  const char* backend;
  int n;
};

class PgThreads : public ::testing::TestWithParam<Param> {};

TEST_P(PgThreads, EveryOpEveryDtypeSmallCounts) {
  auto [backend, n] = GetParam();
  ProcessGroupOptions o;
  o.backend = backend;
  o.timeout_s = 30;
  o.segment_bytes = 64;  // many segments even for small inputs
  o.small_message_bytes = 128;
  run_ranks(n, o, [&](ProcessGroup& pg) {
    Report rep;
    for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64})
      for (size_t count : {size_t(0), size_t(1), size_t(n > 1 ? n - 1 : 2), size_t(101)}) run_all_ops(pg, dt, count, rep);
    EXPECT_EQ(rep.wrong, 0u) << "rank " << pg.rank() << ": " << rep.first;
  });
}

TEST_P(PgThreads, LargeBuffersNotDivisible) {
  auto [backend, n] = GetParam();
  ProcessGroupOptions o;
  o.backend = backend;
  o.timeout_s = 60;
  run_ranks(n, o, [&](ProcessGroup& pg) {
    Report rep;
    run_all_ops(pg, DType::F32, (3u << 20) / 4 + 3, rep);  // ~3 MiB
    run_all_ops(pg, DType::BF16, (1u << 20) + 1, rep);
    EXPECT_EQ(rep.wrong, 0u) << "rank " << pg.rank() << ": " << rep.first;
  });
}

TEST_P(PgThreads, RankOrderedIsBitIdenticalToInOrderSum) {
  auto [backend, n] = GetParam();
  ProcessGroupOptions o;
  o.backend = backend;
  o.deterministic = true;
  o.timeout_s = 30;
  o.segment_bytes = 4096;
  for (size_t count : {size_t(1), size_t(1000), size_t(100003)}) {
    auto want = in_order_sum(n, count);
    run_ranks(n, o, [&](ProcessGroup& pg) {
      auto x = random_floats(pg.rank(), count);
      pg.allreduce(x.data(), count, DType::F32)->wait();
      EXPECT_EQ(std::memcmp(x.data(), want.data(), count * 4), 0) << "rank " << pg.rank() << " count " << count;
      // reduce_scatter in rank order too
      std::vector<float> in(count * n);
      for (int b = 0; b < n; ++b) {
        auto xb = random_floats(pg.rank(), count);
        std::copy(xb.begin(), xb.end(), in.begin() + b * count);
      }
      std::vector<float> out(count);
      pg.reduce_scatter(in.data(), out.data(), count, DType::F32)->wait();
      EXPECT_EQ(std::memcmp(out.data(), want.data(), count * 4), 0) << "rank " << pg.rank();
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Comm, PgThreads,
                         ::testing::Values(Param{"shm", 1}, Param{"shm", 2}, Param{"shm", 3}, Param{"shm", 4},
                                           Param{"tcp", 2}, Param{"tcp", 3}),
                         [](const auto& info) {
                           return std::string(info.param.backend) + "_n" + std::to_string(info.param.n);
                         });

TEST(PgThreadsMisc, SubgroupsCoexist) {
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout_s = 30;
  run_ranks(4, o, [&](ProcessGroup& pg) {
    auto even = pg.new_group({0, 2});
    auto odd = pg.new_group({1, 3});
    auto& sub = pg.rank() % 2 == 0 ? even : odd;
    ASSERT_TRUE(sub);
    EXPECT_EQ(pg.rank() % 2 == 0 ? odd : even, nullptr);
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), pg.rank() / 2);
    int32_t v = pg.rank();
    auto w1 = sub->allreduce(&v, 1, DType::I32);
    int32_t all = 1;
    auto w2 = pg.allreduce(&all, 1, DType::I32);
    w1->wait();
    w2->wait();
    EXPECT_EQ(v, pg.rank() % 2 == 0 ? 0 + 2 : 1 + 3);
    EXPECT_EQ(all, 4);
  });
}

TEST(PgThreadsMisc, AsyncWorksCompleteInOrder) {
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout_s = 30;
  run_ranks(2, o, [&](ProcessGroup& pg) {
    std::vector<std::vector<float>> bufs(20, std::vector<float>(1000, 1.f));
    std::vector<WorkPtr> works;
    for (auto& b : bufs) works.push_back(pg.allreduce(b.data(), b.size(), DType::F32));
    works.back()->wait();
    for (auto& w : works) EXPECT_TRUE(w->is_completed());
    for (auto& b : bufs) EXPECT_EQ(b[999], 2.f);
  });
}

// Small calls nobody waits for still run (on the group's background thread, which polls
// rather than being woken for them): rank 1 only polls is_completed() while rank 0 waits.
TEST(PgThreadsMisc, SmallCallsNobodyWaitsForComplete) {
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout_s = 30;
  run_ranks(2, o, [&](ProcessGroup& pg) {
    for (int round = 0; round < 3; ++round) {
      std::vector<float> v(256, float(pg.rank() + 1));
      WorkPtr w = pg.allreduce(v.data(), v.size(), DType::F32);
      if (pg.rank() == 0) {
        w->wait();
      } else {
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!w->is_completed() && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        ASSERT_TRUE(w->is_completed());
        w->wait();
      }
      EXPECT_EQ(v[255], 3.f);
      // An idle gap longer than the engine's polling window, so the next call finds the
      // background thread asleep.
      if (round == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
}

TEST(PgThreadsMisc, MismatchedCollectiveIsReportedOnEveryRank) {
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout_s = 10;
  o.debug_fingerprint = true;
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto pg = create_process_group(store, r, 2, o);
      float x[8] = {0};
      try {
        if (r == 0) pg->allreduce(x, 8, DType::F32)->wait();
        else pg->broadcast(x, 4, DType::F32, 1)->wait();
      } catch (const CommError& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("mismatch"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("allreduce"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("broadcast"), std::string::npos) << errors[r];
  }
}

TEST(PgThreadsMisc, DeadlinePassesWhenAPeerNeverJoinsTheCollective) {
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout_s = 1;
  auto store = std::make_shared<HashStore>();
  std::string error;
  std::thread other;
  std::shared_ptr<ProcessGroup> pg1;
  other = std::thread([&] { pg1 = create_process_group(store, 1, 2, o); });
  auto pg0 = create_process_group(store, 0, 2, o);
  other.join();
  std::vector<float> x(100000, 1.f);
  auto t0 = std::chrono::steady_clock::now();
  try {
    pg0->allreduce(x.data(), x.size(), DType::F32)->wait();
  } catch (const TimeoutError& e) {
    error = e.what();
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // It failed at the deadline: not before it (an exact bound, the deadline starts when the
  // call runs, after t0), and within 10x of it (a hang bound).
  ASSERT_FALSE(error.empty()) << "no TimeoutError";
  EXPECT_GE(s, 1.0) << error;
  EXPECT_LT(s, 10.0) << error;
  EXPECT_NE(error.find("passed its deadline of 1 s"), std::string::npos) << error;
  EXPECT_NE(error.find("allreduce #0"), std::string::npos) << error;
  EXPECT_NE(error.find("not heard from: 1"), std::string::npos) << error;
  EXPECT_NE(error.find("400000 bytes"), std::string::npos) << error;
  // The group is unusable afterwards: later calls fail at once.
  EXPECT_THROW(pg0->barrier()->wait(), CommError);
  pg1.reset();
  pg0.reset();
}

}  // namespace
