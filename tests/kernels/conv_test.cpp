#include <cmath>
#include <limits>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::grad_check;
using testing::randn;

std::vector<double> conv_ref(const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& bias, int64_t N, int64_t Ci, int64_t H,
                             int64_t W, int64_t Co, int64_t K, int64_t s, int64_t p) {
  const int64_t Ho = (H + 2 * p - K) / s + 1, Wo = (W + 2 * p - K) / s + 1;
  std::vector<double> out(N * Co * Ho * Wo);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t co = 0; co < Co; ++co)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          double acc = bias.empty() ? 0.0 : bias[co];
          for (int64_t ci = 0; ci < Ci; ++ci)
            for (int64_t kh = 0; kh < K; ++kh)
              for (int64_t kw = 0; kw < K; ++kw) {
                int64_t ih = oh * s - p + kh, iw = ow * s - p + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += double(x[((n * Ci + ci) * H + ih) * W + iw]) * w[((co * Ci + ci) * K + kh) * K + kw];
              }
          out[((n * Co + co) * Ho + oh) * Wo + ow] = acc;
        }
  return out;
}

TEST(Conv2d, ForwardMatchesReference) {
  struct Case { int64_t N, Ci, H, W, Co, K, s, p; };
  for (Case c : {Case{1, 1, 1, 1, 1, 1, 1, 0}, Case{2, 3, 7, 5, 4, 3, 1, 1}, Case{3, 2, 9, 9, 5, 3, 2, 0},
                 Case{2, 1, 28, 28, 8, 5, 1, 2}, Case{40, 16, 28, 28, 4, 3, 1, 1} /* 2 chunks */}) {
    auto x = randn(c.N * c.Ci * c.H * c.W, 1), w = randn(c.Co * c.Ci * c.K * c.K, 2), b = randn(c.Co, 3);
    const int64_t Ho = conv2d_out_size(c.H, c.K, c.s, c.p), Wo = conv2d_out_size(c.W, c.K, c.s, c.p);
    std::vector<float> out(c.N * c.Co * Ho * Wo);
    conv2d_forward(out.data(), x.data(), w.data(), b.data(), c.N, c.Ci, c.H, c.W, c.Co, c.K, c.s, c.p);
    EXPECT_TRUE(all_close(out, conv_ref(x, w, b, c.N, c.Ci, c.H, c.W, c.Co, c.K, c.s, c.p), 1e-4, 1e-4));
  }
  EXPECT_THROW(conv2d_out_size(2, 5, 1, 1), InputError);
}

TEST(Conv2d, BackwardGradCheck) {
  const int64_t N = 2, Ci = 2, H = 6, W = 5, Co = 3, K = 3, s = 2, p = 1;
  const int64_t Ho = conv2d_out_size(H, K, s, p), Wo = conv2d_out_size(W, K, s, p);
  auto x = randn(N * Ci * H * W, 4), w = randn(Co * Ci * K * K, 5), b = randn(Co, 6);
  auto g = randn(N * Co * Ho * Wo, 7);
  std::vector<float> dx(x.size(), 0.0f), dw(w.size(), 0.0f), db(Co, 0.0f);
  conv2d_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), N, Ci, H, W, Co, K, s, p);
  auto loss = [&] {
    std::vector<float> o(N * Co * Ho * Wo);
    conv2d_forward(o.data(), x.data(), w.data(), b.data(), N, Ci, H, W, Co, K, s, p);
    return testing::dot(g, o);
  };
  EXPECT_TRUE(grad_check(x, dx, loss, 1e-2f, 2e-3, 1e-2, 120));
  EXPECT_TRUE(grad_check(w, dw, loss, 1e-2f, 2e-3, 1e-2, 60));
  EXPECT_TRUE(grad_check(b, db, loss, 1e-2f, 2e-3, 1e-2));
  // accumulation: a second backward doubles the gradients
  auto dw1 = dw;
  conv2d_backward(nullptr, dw.data(), nullptr, g.data(), x.data(), w.data(), N, Ci, H, W, Co, K, s, p);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], 2 * dw1[i], 1e-4);
}

// Big enough for the images to be processed in two chunks: the result must equal image-by-
// image calls.
TEST(Conv2d, ChunkedBackwardEqualsPerImage) {
  const int64_t N = 40, Ci = 16, H = 28, W = 28, Co = 4, K = 3, s = 1, p = 1, L = 28 * 28;
  auto x = randn(N * Ci * H * W, 11, 0.5f), w = randn(Co * Ci * K * K, 12), g = randn(N * Co * L, 13);
  std::vector<float> dx(x.size(), 0.0f), dw(w.size(), 0.0f), dx1(x.size(), 0.0f), dw1(w.size(), 0.0f);
  conv2d_backward(dx.data(), dw.data(), nullptr, g.data(), x.data(), w.data(), N, Ci, H, W, Co, K, s, p);
  for (int64_t n = 0; n < N; ++n)
    conv2d_backward(dx1.data() + n * Ci * H * W, dw1.data(), nullptr, g.data() + n * Co * L,
                    x.data() + n * Ci * H * W, w.data(), 1, Ci, H, W, Co, K, s, p);
  EXPECT_TRUE(all_close(dx, dx1, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(dw, dw1, 1e-3, 1e-4));
}

TEST(MaxPool2d, ForwardBackward) {
  const int64_t N = 2, C = 3, H = 7, W = 6, K = 3, s = 2, p = 1;
  const int64_t Ho = conv2d_out_size(H, K, s, p), Wo = conv2d_out_size(W, K, s, p);
  auto x = randn(N * C * H * W, 8);
  std::vector<float> out(N * C * Ho * Wo);
  std::vector<int32_t> am(out.size());
  maxpool2d_forward(out.data(), am.data(), x.data(), N, C, H, W, K, s, p);
  for (int64_t q = 0; q < N * C; ++q)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t kh = 0; kh < K; ++kh)
          for (int64_t kw = 0; kw < K; ++kw) {
            int64_t ih = oh * s - p + kh, iw = ow * s - p + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W) m = std::max(m, x[q * H * W + ih * W + iw]);
          }
        EXPECT_EQ(out[q * Ho * Wo + oh * Wo + ow], m);
        EXPECT_EQ(x[q * H * W + am[q * Ho * Wo + oh * Wo + ow]], m);
      }
  auto g = randn(out.size(), 9);
  std::vector<float> dx(x.size(), 0.0f);
  maxpool2d_backward(dx.data(), g.data(), am.data(), N, C, H, W, Ho, Wo);
  auto loss = [&] {
    std::vector<float> o(out.size());
    std::vector<int32_t> a(out.size());
    maxpool2d_forward(o.data(), a.data(), x.data(), N, C, H, W, K, s, p);
    return testing::dot(g, o);
  };
  EXPECT_TRUE(grad_check(x, dx, loss, 1e-3f, 1e-3, 1e-2, 300));
}

// Unpadded windows (the CNN's 2x2 pool takes a path without bounds checks): the maximum and
// its first position, ties to the first, a NaN propagates and the first NaN is kept (as the
// padded path and PyTorch).
TEST(MaxPool2d, UnpaddedWindowsTakeTheFirstMaximumAndTheFirstNaN) {
  for (const auto& [K, s] : std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {3, 2}, {3, 1}}) {
    const int64_t N = 2, C = 2, H = 8, W = 9;
    const int64_t Ho = conv2d_out_size(H, K, s, 0), Wo = conv2d_out_size(W, K, s, 0);
    auto x = randn(N * C * H * W, 21);
    for (size_t i = 0; i < x.size(); i += 5) x[i] = std::round(x[i]);  // ties
    x[10] = std::numeric_limits<float>::quiet_NaN();
    x[11] = std::numeric_limits<float>::quiet_NaN();
    x[H * W + 3 * W + 4] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> out(N * C * Ho * Wo);
    std::vector<int32_t> am(out.size());
    maxpool2d_forward(out.data(), am.data(), x.data(), N, C, H, W, K, s, 0);
    for (int64_t q = 0; q < N * C; ++q)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          int64_t best = -1;
          for (int64_t kh = 0; kh < K; ++kh)
            for (int64_t kw = 0; kw < K; ++kw) {
              const int64_t i = (oh * s + kh) * W + ow * s + kw;
              const float v = x[q * H * W + i];
              if (best < 0) best = i;
              else if (const float m = x[q * H * W + best]; m == m && (v > m || v != v)) best = i;
            }
          const int64_t o = q * Ho * Wo + oh * Wo + ow;
          SCOPED_TRACE(::testing::Message() << "K " << K << " s " << s << " window " << q << "," << oh << "," << ow);
          EXPECT_EQ(am[o], best);
          const float want = x[q * H * W + best];
          if (want != want) EXPECT_TRUE(out[o] != out[o]);
          else EXPECT_EQ(out[o], want);
        }
  }
}

}  // namespace
}  // namespace paratrain::kernels::cpu
