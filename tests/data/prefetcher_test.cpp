#include "paratrain/data/prefetcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>

#include "data/temp_dir.h"
#include "paratrain/base/error.h"
#include "paratrain/data/token_loader.h"

using namespace paratrain;
using namespace paratrain::data;
using paratrain::testing::TempDir;

namespace {

std::string make_file(const TempDir& d, int n) {
  std::vector<uint16_t> t(n);
  std::iota(t.begin(), t.end(), 0);
  auto p = d.path("tok.bin");
  write_token_file(p, t);
  return p;
}

std::vector<int32_t> values(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// Runs `fn` when the scope ends (declared after a prefetcher: frees a fill the test holds,
// so the prefetcher's destructor can join its worker even after a failed ASSERT).
template <typename Fn>
struct AtExit {
  Fn fn;
  ~AtExit() { fn(); }
};
template <typename Fn>
AtExit(Fn) -> AtExit<Fn>;

}  // namespace

TEST(BatchPrefetcher, PrefetchedBatchesEqualBatchesFilledOnTheSpot) {
  TempDir d;
  const auto path = make_file(d, 4000);
  BatchLayout layout{3, 2, 2};
  TokenLoader worker_loader(path, 8, layout, 11), direct(path, 8, layout, 11);
  std::atomic<std::thread::id> filler;
  BatchPrefetcher pf([&](const BatchRequest& r, Tensor& x, Tensor& y) {
    filler = std::this_thread::get_id();
    worker_loader.fill_range(r.step, r.micro_step, r.first, r.count, x, y);
  });
  // Rank 1 of 2 with uneven ranges from step 3 on (what --balance does).
  auto req = [](int64_t s, int64_t k) {
    return s < 3 ? BatchRequest{s, k, 3, 3} : BatchRequest{s, k, 4, 2};
  };
  for (int64_t k = 0; k < 2; ++k) pf.enqueue(req(0, k));
  const void* first_buffer = nullptr;
  for (int64_t s = 0; s < 8; ++s) {
    for (int64_t k = 0; k < 2; ++k) {
      if (k == 0 && s + 1 < 8)
        for (int64_t kk = 0; kk < 2; ++kk) pf.enqueue(req(s + 1, kk));
      const Batch& b = pf.next(req(s, k));
      EXPECT_EQ(b.request, req(s, k));
      Tensor x, y;
      direct.fill_range(s, k, req(s, k).first, req(s, k).count, x, y);
      EXPECT_EQ(values(b.inputs), values(x)) << req(s, k).str();
      EXPECT_EQ(values(b.targets), values(y));
      if (s == 0 && k == 0) first_buffer = b.inputs.data_ptr();
    }
  }
  EXPECT_NE(filler.load(), std::this_thread::get_id());  // filled in the background
  EXPECT_NE(first_buffer, nullptr);
  EXPECT_EQ(pf.announced(), 0u);
}

TEST(BatchPrefetcher, UnannouncedRequestDropsThePlanAndStillGetsItsBatch) {
  std::atomic<int> fills{0};
  BatchPrefetcher pf([&](const BatchRequest& r, Tensor& x, Tensor& y) {
    ++fills;
    x = Tensor::full({r.count}, static_cast<float>(r.step * 10 + r.first));
    y = Tensor::full({1}, 0.0f);
  });
  pf.enqueue({0, 0, 0, 2});
  pf.enqueue({1, 0, 0, 2});
  const Batch& b = pf.next({0, 0, 1, 3});  // not the announced range
  EXPECT_EQ(b.inputs.numel(), 3);
  EXPECT_EQ(b.inputs.to_vector()[0], 1.0f);
  EXPECT_EQ(pf.announced(), 0u);
  const Batch& c = pf.next({1, 0, 0, 2});  // nothing announced: filled on demand
  EXPECT_EQ(c.inputs.to_vector()[0], 10.0f);
}

TEST(BatchPrefetcher, MeasuresTheTimeAStepWaitedForData) {
  // No judgement by the clock against a sleep: the fill itself measures how long it ran,
  // and the test waits for events (the worker starting a fill), never for a duration.
  constexpr double kFillS = 0.06;
  std::mutex mu;
  std::condition_variable cv;
  double fill_s = 0;           // how long the fill of step 0 ran (measured by the fill)
  bool step2_started = false;  // the worker began the fill of step 2
  bool release_step2 = false;
  BatchPrefetcher pf([&](const BatchRequest& r, Tensor& x, Tensor& y) {
    const auto t0 = std::chrono::steady_clock::now();
    if (r.step == 2) {  // holds the worker until the end of the test
      std::unique_lock<std::mutex> lock(mu);
      step2_started = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release_step2; });
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(kFillS));
    }
    x = Tensor::full({1}, static_cast<float>(r.step));
    y = x;
    if (r.step == 0) {
      std::lock_guard<std::mutex> lock(mu);
      fill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  });
  const auto release = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      release_step2 = true;
    }
    cv.notify_all();
  };
  AtExit release_at_exit{release};
  // Nobody announced step 0: next() starts the fill and waits for all of it (the fill
  // starts after next() began waiting and ends before it returns: an exact lower bound).
  pf.next({0, 0, 0, 1});
  const double waited = pf.take_wait_seconds();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_GE(fill_s, kFillS - 1e-6);  // (the sleep's rounding to whole nanoseconds)
    EXPECT_GE(waited, fill_s);
  }
  EXPECT_EQ(pf.take_wait_seconds(), 0.0);  // reset
  // Step 1 announced, then step 2: the worker fills in order, so once it has started step 2,
  // step 1 is ready and next() does not block on it (it would wait >= kFillS if it did).
  pf.enqueue({1, 0, 0, 1});
  pf.enqueue({2, 0, 0, 1});
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return step2_started; }))
        << "the worker never reached step 2";
  }
  EXPECT_EQ(pf.next({1, 0, 0, 1}).inputs.to_vector()[0], 1.0f);
  EXPECT_LT(pf.take_wait_seconds(), kFillS / 2) << "a batch prepared in the background was waited for";
  release();
  EXPECT_EQ(pf.next({2, 0, 0, 1}).inputs.to_vector()[0], 2.0f);
}

TEST(BatchPrefetcher, FillErrorsReachTheConsumer) {
  BatchPrefetcher pf([](const BatchRequest& r, Tensor&, Tensor&) {
    if (r.step == 1) PT_THROW(InputError, "bad example in step 1");
  });
  pf.enqueue({0, 0, 0, 1});
  pf.enqueue({1, 0, 0, 1});
  pf.next({0, 0, 0, 1});
  try {
    pf.next({1, 0, 0, 1});
    FAIL() << "expected the worker's error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad example in step 1"), std::string::npos);
  }
}

TEST(BatchPrefetcher, StuckWorkerIsATimeoutNamingTheBatch) {
  std::atomic<bool> release{false};
  BatchPrefetcher pf(
      [&](const BatchRequest&, Tensor&, Tensor&) {
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      },
      0.2);
  AtExit release_at_exit{[&] { release = true; }};
  try {
    pf.next({4, 1, 0, 2});
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("step 4, micro-step 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("within 0.2 s"), std::string::npos) << e.what();
  }
  // It gave up at its deadline, not before (a lower bound: the clock is monotonic; the 1 us
  // covers the deadline's rounding to the clock's ticks).
  EXPECT_GE(pf.take_wait_seconds(), 0.2 - 1e-6);
}
