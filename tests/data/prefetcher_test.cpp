#include "paratrain/data/prefetcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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
  BatchPrefetcher pf([](const BatchRequest&, Tensor& x, Tensor& y) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    x = Tensor::full({1}, 1.0f);
    y = x;
  });
  pf.next({0, 0, 0, 1});  // nobody announced it: the whole fill is waited for
  const double waited = pf.take_wait_seconds();
  EXPECT_GE(waited, 0.05);
  EXPECT_EQ(pf.take_wait_seconds(), 0.0);  // reset
  pf.enqueue({1, 0, 0, 1});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the step's compute hides the fill
  pf.next({1, 0, 0, 1});
  EXPECT_LT(pf.take_wait_seconds(), 0.05);
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
  try {
    pf.next({4, 1, 0, 2});
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("step 4, micro-step 1"), std::string::npos) << e.what();
  }
  release = true;
}
