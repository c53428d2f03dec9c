#include <cmath>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::grad_check;
using testing::randn;

TEST(LayerNorm, ForwardMatchesDoubleReference) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {9, 384}, {2, 1001}}) {
    auto x = randn(N * C, 1, 2.0f), w = randn(C, 2), b = randn(C, 3);
    for (auto& v : x) v += 5.0f;  // offset mean
    std::vector<float> out(N * C), mean(N), rstd(N), want(N * C);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    for (int64_t n = 0; n < N; ++n) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
      m /= C;
      for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
      v /= C;
      double rs = 1.0 / std::sqrt(v + 1e-5);
      EXPECT_NEAR(mean[n], m, 1e-5);
      EXPECT_NEAR(rstd[n], rs, 1e-4 * rs);
      for (int64_t c = 0; c < C; ++c) want[n * C + c] = static_cast<float>((x[n * C + c] - m) * rs * w[c] + b[c]);
    }
    EXPECT_TRUE(all_close(out, want, 1e-4, 1e-4)) << N << "x" << C;
  }
}

TEST(LayerNorm, BackwardGradCheck) {
  const int64_t N = 5, C = 19;
  auto x = randn(N * C, 4), w = randn(C, 5), b = randn(C, 6), dout = randn(N * C, 7);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  std::vector<float> dx(N * C, 0.25f), dw(C, 0.25f), db(C, 0.25f);
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  for (auto* g : {&dx, &dw, &db})
    for (auto& v : *g) v -= 0.25f;
  auto loss = [&] {
    std::vector<float> o(N * C);
    layernorm_forward(o.data(), nullptr, nullptr, x.data(), w.data(), b.data(), N, C);
    return testing::dot(dout, o);
  };
  EXPECT_TRUE(grad_check(x, dx, loss, 1e-2f, 2e-3, 1e-2));
  EXPECT_TRUE(grad_check(w, dw, loss, 1e-2f, 2e-3, 1e-2));
  EXPECT_TRUE(grad_check(b, db, loss, 1e-2f, 2e-3, 1e-2));
  // no-affine variant
  std::vector<float> dx2(N * C, 0.0f);
  layernorm_backward(dx2.data(), nullptr, nullptr, dout.data(), x.data(), nullptr, mean.data(),
                     rstd.data(), N, C);
  auto loss2 = [&] {
    std::vector<float> o(N * C);
    layernorm_forward(o.data(), nullptr, nullptr, x.data(), nullptr, nullptr, N, C);
    return testing::dot(dout, o);
  };
  EXPECT_TRUE(grad_check(x, dx2, loss2, 1e-2f, 2e-3, 1e-2));
}

}  // namespace
}  // namespace paratrain::kernels::cpu
