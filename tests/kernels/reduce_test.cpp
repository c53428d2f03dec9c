#include <cmath>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::randn;

TEST(Reduce, SumSumSquaresMaxFinite) {
  for (int64_t n : {0, 1, 17, 16384, 16385, 100003}) {
    auto x = randn(n, 1);
    double s = 0, ss = 0;
    float m = -INFINITY;
    for (float v : x) { s += v; ss += double(v) * v; m = std::max(m, v); }
    EXPECT_NEAR(sum(x.data(), n), s, 1e-9 * (1 + n));
    EXPECT_NEAR(sum_squares(x.data(), n), ss, 1e-9 * (1 + n));
    EXPECT_EQ(max(x.data(), n), m);
    EXPECT_TRUE(all_finite(x.data(), n));
    if (n > 10) {
      // the result does not depend on the thread count
      set_num_threads(1);
      double s1 = sum_squares(x.data(), n);
      set_num_threads(2);
      EXPECT_EQ(s1, sum_squares(x.data(), n));
      x[n / 2] = INFINITY;
      EXPECT_FALSE(all_finite(x.data(), n));
      x[n / 2] = NAN;
      EXPECT_FALSE(all_finite(x.data(), n));
      EXPECT_TRUE(std::isnan(max(x.data(), n)));
    }
  }
}

TEST(Reduce, AxisSums) {
  for (auto [O, N, I] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 5, 7}, {2, 300, 1}, {4, 9, 513}}) {
    auto x = randn(O * N * I, 2);
    std::vector<float> out(O * I);
    std::vector<double> want(O * I, 0.0);
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < N; ++k)
        for (int64_t i = 0; i < I; ++i) want[o * I + i] += x[(o * N + k) * I + i];
    sum_axis(out.data(), x.data(), O, N, I);
    EXPECT_TRUE(all_close(out, want, 1e-5, 1e-5));
  }
  const int64_t N = 6, C = 19;
  auto x = randn(N * C, 3);
  std::vector<float> rows(C), cols(N), mx(N);
  std::vector<int32_t> am(N);
  sum_rows(rows.data(), x.data(), N, C);
  sum_cols(cols.data(), x.data(), N, C);
  max_cols(mx.data(), am.data(), x.data(), N, C);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += x[n * C + c];
    EXPECT_NEAR(rows[c], s, 1e-5);
  }
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    int64_t a = 0;
    for (int64_t c = 0; c < C; ++c) {
      s += x[n * C + c];
      if (x[n * C + c] > x[n * C + a]) a = c;
    }
    EXPECT_NEAR(cols[n], s, 1e-5);
    EXPECT_EQ(am[n], a);
    EXPECT_EQ(mx[n], x[n * C + a]);
  }
}

}  // namespace
}  // namespace paratrain::kernels::cpu
