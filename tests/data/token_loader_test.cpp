#include "paratrain/data/token_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "data/temp_dir.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::data;
using paratrain::testing::error_of;
using paratrain::testing::TempDir;
using ::testing::HasSubstr;

namespace {

// Tokens 0, 1, 2, ... so every window's content reveals its index.
std::string make_file(const TempDir& d, int n) {
  std::vector<uint16_t> t(n);
  std::iota(t.begin(), t.end(), 0);
  auto p = d.path("tok.bin");
  write_token_file(p, t);
  return p;
}

}  // namespace

TEST(TokenLoader, NumWindows) {
  EXPECT_EQ(num_windows(0, 4), 0);
  EXPECT_EQ(num_windows(1, 4), 0);
  EXPECT_EQ(num_windows(4, 4), 0);
  EXPECT_EQ(num_windows(5, 4), 1);
  EXPECT_EQ(num_windows(8, 4), 1);
  EXPECT_EQ(num_windows(9, 4), 2);
  EXPECT_EQ(num_windows(101, 10), 10);
}

TEST(TokenLoader, FillsWindowsOfTheDocumentedOrder) {
  TempDir d;
  auto p = make_file(d, 1000);
  const int64_t T = 8;
  BatchLayout L{2, 2, 2};
  TokenLoader loader(p, T, L, 42);
  EXPECT_EQ(loader.num_windows(), 124);  // (1000-1)/8
  EXPECT_EQ(loader.steps_per_epoch(), 124 / 8);
  EXPECT_EQ(loader.tokens_per_step(), 64);
  DataOrder order(124, L, 42);
  Tensor x, y;
  for (int64_t s : {0, 1, 15, 16, 40})
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t r = 0; r < 2; ++r) {
        loader.fill(s, k, r, x, y);
        ASSERT_EQ(x.shape(), (Shape{2, T}));
        ASSERT_EQ(y.shape(), (Shape{2, T}));
        ASSERT_EQ(x.dtype(), DType::I32);
        auto w = order.items(s, k, r);
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t t = 0; t < T; ++t) {
            EXPECT_EQ(x.data<int32_t>()[b * T + t], w[b] * T + t);
            EXPECT_EQ(y.data<int32_t>()[b * T + t], w[b] * T + t + 1);
          }
      }
}

TEST(TokenLoader, ReusesTensorsOfTheRightShape) {
  TempDir d;
  auto p = make_file(d, 200);
  TokenLoader loader(p, 4, {3, 1, 1}, 1);
  Tensor x, y;
  loader.fill(0, 0, 0, x, y);
  void* px = x.data_ptr();
  loader.fill(1, 0, 0, x, y);
  EXPECT_EQ(x.data_ptr(), px);
}

TEST(TokenLoader, LastWindowUsesLastToken) {
  TempDir d;
  auto p = make_file(d, 9);  // windows [0..4], [4..8]
  TokenEvalLoader ev(p, 4, 2);
  ASSERT_EQ(ev.num_batches(), 1);
  Tensor x, y;
  ev.fill(0, x, y);
  EXPECT_EQ(x.to_vector_i64(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(y.to_vector_i64(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(TokenLoader, EvalInFileOrder) {
  TempDir d;
  auto p = make_file(d, 100);
  TokenEvalLoader ev(p, 5, 3);  // 19 windows -> 6 batches
  EXPECT_EQ(ev.num_batches(), 6);
  Tensor x, y;
  ev.fill(5, x, y);
  EXPECT_EQ(x.data<int32_t>()[0], 15 * 5);
  EXPECT_EQ(x.data<int32_t>()[2 * 5 + 4], 17 * 5 + 4);
  EXPECT_THROW(ev.fill(6, x, y), InternalError);
}

TEST(TokenLoader, TooSmallForOneGlobalBatch) {
  TempDir d;
  auto p = make_file(d, 50);
  auto msg = error_of<InputError>([&] { TokenLoader l(p, 8, {4, 1, 2}, 1); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("has 6 examples, fewer than one global batch of 8"));
  auto msg2 = error_of<InputError>([&] { TokenEvalLoader l(p, 8, 7); });
  EXPECT_THAT(msg2, HasSubstr("6 windows, fewer than one evaluation batch of 7"));
}

TEST(TokenLoader, BadBlockSizeAndMissingFile) {
  TempDir d;
  auto p = make_file(d, 50);
  EXPECT_THAT(error_of<InputError>([&] { TokenLoader l(p, 0, {1, 1, 1}, 1); }), HasSubstr("block size 0"));
  EXPECT_THAT(error_of<InputError>([&] { TokenLoader l(d.path("missing.bin"), 4, {1, 1, 1}, 1); }),
              HasSubstr("cannot open token file"));
}
