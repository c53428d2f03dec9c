#include <cmath>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::grad_check;
using testing::randn;

// Naive O(T^2) attention in double: out (B,T,C), lse (B,NH,T); and its backward.
struct Ref {
  std::vector<double> out, lse, dqkv;
};

Ref reference(const std::vector<float>& qkv, const std::vector<float>& dout, int64_t B,
              int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  Ref r{std::vector<double>(B * T * C), std::vector<double>(B * NH * T), std::vector<double>(B * T * C3)};
  auto Q = [&](int64_t b, int64_t t, int64_t h, int64_t i) { return double(qkv[(b * T + t) * C3 + h * hs + i]); };
  auto K = [&](int64_t b, int64_t t, int64_t h, int64_t i) { return double(qkv[(b * T + t) * C3 + C + h * hs + i]); };
  auto V = [&](int64_t b, int64_t t, int64_t h, int64_t i) { return double(qkv[(b * T + t) * C3 + 2 * C + h * hs + i]); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(t + 1), dp(t + 1);
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hs; ++i) d += Q(b, t, h, i) * K(b, j, h, i);
          p[j] = d * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = 0; j <= t; ++j) s += std::exp(p[j] - m);
        for (int64_t j = 0; j <= t; ++j) p[j] = std::exp(p[j] - m) / s;
        r.lse[(b * NH + h) * T + t] = m + std::log(s);
        for (int64_t i = 0; i < hs; ++i) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) o += p[j] * V(b, j, h, i);
          r.out[(b * T + t) * C + h * hs + i] = o;
        }
        if (dout.empty()) continue;
        const float* g = dout.data() + (b * T + t) * C + h * hs;
        double sum_pdp = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hs; ++i) {
            d += g[i] * V(b, j, h, i);
            r.dqkv[(b * T + j) * C3 + 2 * C + h * hs + i] += p[j] * g[i];
          }
          dp[j] = d;
          sum_pdp += p[j] * d;
        }
        for (int64_t j = 0; j <= t; ++j) {
          double ds = p[j] * (dp[j] - sum_pdp) * scale;
          for (int64_t i = 0; i < hs; ++i) {
            r.dqkv[(b * T + t) * C3 + h * hs + i] += ds * K(b, j, h, i);
            r.dqkv[(b * T + j) * C3 + C + h * hs + i] += ds * Q(b, t, h, i);
          }
        }
      }
  return r;
}

void run_case(int64_t B, int64_t T, int64_t C, int64_t NH, int threads) {
  set_num_threads(threads);
  auto qkv = randn(B * T * 3 * C, 100 + T, 1.0f);
  auto dout = randn(B * T * C, 200 + T);
  std::vector<float> out(B * T * C, NAN), lse(B * NH * T), dqkv(B * T * 3 * C, 0.5f);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  for (auto& v : dqkv) v -= 0.5f;
  Ref r = reference(qkv, dout, B, T, C, NH);
  EXPECT_TRUE(all_close(out, r.out, 1e-5, 1e-4)) << "out B=" << B << " T=" << T;
  EXPECT_TRUE(all_close(lse, r.lse, 1e-5, 1e-5)) << "lse T=" << T;
  EXPECT_TRUE(all_close(dqkv, r.dqkv, 1e-4, 1e-3)) << "dqkv B=" << B << " T=" << T;
  set_num_threads(2);
}

TEST(Attention, MatchesNaiveReference) {
  run_case(1, 1, 8, 2, 2);     // T = 1
  run_case(2, 5, 12, 3, 2);    // tiny, hs = 4
  run_case(1, 64, 16, 2, 1);   // exactly one block
  run_case(2, 65, 16, 1, 2);   // one block plus one row
  run_case(1, 130, 64, 1, 2);  // fewer heads than threads: serial heads, threaded GEMMs
  run_case(2, 97, 24, 2, 1);
}

TEST(Attention, FiniteDifferenceGradient) {
  const int64_t B = 1, T = 6, C = 8, NH = 2;
  auto qkv = randn(B * T * 3 * C, 7), w = randn(B * T * C, 8);
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(B * T * 3 * C, 0.0f);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  attention_backward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  auto loss = [&] {
    std::vector<float> o(B * T * C);
    attention_forward(o.data(), nullptr, qkv.data(), B, T, C, NH);
    return testing::dot(w, o);
  };
  EXPECT_TRUE(grad_check(qkv, dqkv, loss, 1e-2f, 2e-3, 1e-2, 144));
}

TEST(Attention, BadShapes) {
  std::vector<float> x(100);
  EXPECT_THROW(attention_forward(x.data(), x.data(), x.data(), 1, 2, 10, 3), InputError);
}

}  // namespace
}  // namespace paratrain::kernels::cpu
