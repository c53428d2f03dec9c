#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::grad_check;
using testing::randn;

// Sizes around the vector width and the threading grain.
const int64_t kSizes[] = {1, 7, 8, 15, 17, 100, 1000, 70001};

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(Elementwise, BinaryAndScalarOps) {
  for (int64_t n : kSizes) {
    auto a = randn(n, 1), b = randn(n, 2);
    for (auto& v : b) v = v == 0.0f ? 1.0f : v;
    std::vector<float> out(n), want(n);
    add(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
    EXPECT_EQ(out, want);
    sub(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] - b[i];
    EXPECT_EQ(out, want);
    mul(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] * b[i];
    EXPECT_EQ(out, want);
    div(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] / b[i];
    EXPECT_EQ(out, want);
    scale(out.data(), a.data(), 3.0f, n);
    for (int64_t i = 0; i < n; ++i) want[i] = 3.0f * a[i];
    EXPECT_EQ(out, want);
    add_scalar(out.data(), a.data(), -2.0f, n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] - 2.0f;
    EXPECT_EQ(out, want);
    fill(out.data(), 4.5f, n);
    EXPECT_EQ(out, std::vector<float>(n, 4.5f));
    copy(out.data(), a.data(), n);
    EXPECT_EQ(out, a);
    axpy(out.data(), b.data(), 2.0f, n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + 2.0f * b[i];
    EXPECT_TRUE(all_close(out, want, 1e-6, 1e-6));
    axpby(out.data(), b.data(), 2.0f, 0.5f, n);
    for (int64_t i = 0; i < n; ++i) want[i] = 2.0f * b[i] + 0.5f * want[i];
    EXPECT_TRUE(all_close(out, want, 1e-6, 1e-6));
    copy(out.data(), a.data(), n);
    mul_acc(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + a[i] * b[i];
    EXPECT_TRUE(all_close(out, want, 1e-6, 1e-6));
    add(a.data(), a.data(), b.data(), n);  // aliasing out == a
    for (int64_t i = 0; i < n; ++i) want[i] = (a[i] - b[i]) + b[i];
    EXPECT_TRUE(all_close(a, want, 1e-5, 1e-5));
  }
}

TEST(Elementwise, TranscendentalsMatchLibm) {
  for (int64_t n : kSizes) {
    auto x = randn(n, 3, 3.0f);
    std::vector<float> out(n), want(n);
    gelu_forward(out.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = static_cast<float>(gelu_ref(x[i]));
    EXPECT_TRUE(all_close(out, want, 1e-6, 1e-6)) << "gelu n=" << n;
    tanh_forward(out.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = std::tanh(x[i]);
    EXPECT_TRUE(all_close(out, want, 1e-7, 1e-6)) << "tanh n=" << n;
    exp_forward(out.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = std::exp(x[i]);
    EXPECT_TRUE(all_close(out, want, 0, 3e-7)) << "exp n=" << n;
    sigmoid_forward(out.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = 1.0f / (1.0f + std::exp(-x[i]));
    EXPECT_TRUE(all_close(out, want, 1e-7, 1e-6)) << "sigmoid n=" << n;
    relu_forward(out.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) want[i] = x[i] > 0 ? x[i] : 0.0f;
    EXPECT_EQ(out, want);
  }
  std::vector<float> x = {-1000.0f, 1000.0f, NAN, -INFINITY, 0.0f, 88.0f, -87.0f, 1e-6f};
  std::vector<float> out(x.size());
  exp_forward(out.data(), x.data(), x.size());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_TRUE(std::isinf(out[1]));
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[4], 1.0f);
  EXPECT_NEAR(out[5] / std::exp(88.0f), 1.0, 1e-6);
  EXPECT_NEAR(out[6] / std::exp(-87.0f), 1.0, 1e-6);
  gelu_forward(out.data(), x.data(), x.size());
  EXPECT_NEAR(out[0], 0.0f, 1e-30);
  EXPECT_EQ(out[1], 1000.0f);
  EXPECT_TRUE(std::isnan(out[2]));
  std::vector<float> ones(x.size(), 1.0f), d(x.size(), 0.0f);
  gelu_backward(d.data(), ones.data(), x.data(), x.size());
  EXPECT_EQ(d[0], 0.0f);
  EXPECT_EQ(d[1], 1.0f);
  EXPECT_FLOAT_EQ(d[4], 0.5f);
  tanh_forward(out.data(), x.data(), x.size());
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_FLOAT_EQ(out[7], 1e-6f);
}

// Gradient checks of the activations: loss = sum(w * f(x)), dinp accumulates on top of 1.
void check_activation(void (*fwd)(float*, const float*, int64_t),
                      void (*bwd)(float*, const float*, const float*, int64_t), bool uses_out,
                      const char* name) {
  const int64_t n = 37;
  auto x = randn(n, 11, 1.5f), w = randn(n, 12);
  for (auto& v : x) if (std::abs(v) < 0.05f) v = 0.3f;  // keep relu away from its kink
  std::vector<float> out(n), dinp(n, 1.0f);
  fwd(out.data(), x.data(), n);
  bwd(dinp.data(), w.data(), uses_out ? out.data() : x.data(), n);
  for (auto& d : dinp) d -= 1.0f;
  auto loss = [&] {
    std::vector<float> o(n);
    fwd(o.data(), x.data(), n);
    return testing::dot(w, o);
  };
  EXPECT_TRUE(grad_check(x, dinp, loss, 1e-2f, 2e-3, 1e-2)) << name;
}

TEST(Elementwise, ActivationGradients) {
  check_activation(gelu_forward, gelu_backward, false, "gelu");
  check_activation(relu_forward, relu_backward, false, "relu");
  check_activation(tanh_forward, tanh_backward, true, "tanh");
  check_activation(sigmoid_forward, sigmoid_backward, true, "sigmoid");
}

TEST(Elementwise, GeluBackwardMatchesDoubleDerivative) {
  for (int64_t n : kSizes) {
    auto x = randn(n, 21, 3.0f), g = randn(n, 22);
    std::vector<float> d(n, 0.0f), want(n);
    gelu_backward(d.data(), g.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double h = 1e-4, xd = x[i];
      want[i] = static_cast<float>(g[i] * (gelu_ref(xd + h) - gelu_ref(xd - h)) / (2 * h));
    }
    EXPECT_TRUE(all_close(d, want, 1e-5, 1e-4)) << "n=" << n;
  }
}

TEST(Elementwise, BiasAddAndBackward) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {5, 17}, {300, 384}, {3, 1000}}) {
    auto out = randn(N * C, 1), bias = randn(C, 2), dout = randn(N * C, 3);
    auto want = out;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) want[n * C + c] += bias[c];
    bias_add(out.data(), bias.data(), N, C);
    EXPECT_EQ(out, want);
    std::vector<float> db(C, 1.0f);
    std::vector<double> wd(C, 1.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) wd[c] += dout[n * C + c];
    bias_backward(db.data(), dout.data(), N, C);
    EXPECT_TRUE(all_close(db, wd, 1e-4, 1e-5));
  }
}

TEST(Elementwise, Dropout) {
  const int64_t n = 1001;
  auto x = randn(n, 1), g = randn(n, 2);
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = (i * 7) % 3 != 0;
  std::vector<float> out(n), d(n, 0.5f);
  dropout_forward(out.data(), x.data(), mask.data(), 1.5f, n);
  dropout_backward(d.data(), g.data(), mask.data(), 1.5f, n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], mask[i] ? x[i] * 1.5f : 0.0f * x[i]);
    EXPECT_NEAR(d[i], 0.5f + (mask[i] ? g[i] * 1.5f : 0.0f), 1e-6);
  }
}

// The counter-based mask: element i depends on (key, i) only (any split of the range gives the
// same bytes), the kept fraction is 1 - p within 5 sigma, keys decorrelate, p = 0 keeps all.
TEST(Elementwise, DropoutMaskFromOneKey) {
  const int64_t n = 200001;
  for (float p : {0.1f, 0.5f}) {
    std::vector<uint8_t> a(n), b(n), c(n);
    dropout_mask(a.data(), 12345, p, n);
    dropout_mask(b.data(), 12345, p, n);
    dropout_mask(c.data(), 12346, p, n);
    EXPECT_EQ(a, b) << "the same key, the same mask";
    int64_t kept = 0, same = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(a[i], dropout_keep(12345, i, p)) << i;
      kept += a[i];
      same += a[i] == c[i];
    }
    const double q = 1.0 - p, sigma = std::sqrt(q * p / n);
    EXPECT_NEAR(static_cast<double>(kept) / n, q, 5 * sigma) << "p " << p;
    // two keys agree where both keep or both drop: q^2 + p^2 of the elements
    EXPECT_NEAR(static_cast<double>(same) / n, q * q + p * p, 0.01) << "p " << p;
    std::vector<uint8_t> tail(n - 1000);
    dropout_mask(tail.data(), 12345 + 1000 * 0x9E3779B97F4A7C15ull, p, n - 1000);
    for (int64_t i = 0; i < 50; ++i) ASSERT_EQ(tail[i], a[i + 1000]) << "counter-based: element i is (key, i)";
  }
  std::vector<uint8_t> all(1000);
  dropout_mask(all.data(), 7, 0.0f, 1000);
  for (uint8_t m : all) ASSERT_EQ(m, 1);
}

TEST(Elementwise, Conversions) {
  for (int64_t n : kSizes) {
    auto x = randn(n, 5, 100.0f);
    if (n > 3) { x[0] = NAN; x[1] = INFINITY; x[2] = 1e-40f; }
    std::vector<uint16_t> h(n);
    std::vector<float> back(n);
    f32_to_bf16(h.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h[i], paratrain::f32_to_bf16(x[i])) << i;
    bf16_to_f32(back.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isnan(x[i])) EXPECT_EQ(back[i], paratrain::bf16_to_f32(h[i]));
    f32_to_f16(h.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h[i], paratrain::f32_to_f16(x[i])) << i;
    f16_to_f32(back.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isnan(x[i])) EXPECT_EQ(back[i], paratrain::f16_to_f32(h[i]));
  }
}

TEST(Elementwise, StridedCopyPermutesAndAdds) {
  // x (2,3,4,5) contiguous; view = permute(3,1,0,2) -> sizes (5,3,2,4)
  const int64_t s[4] = {2, 3, 4, 5};
  auto x = randn(120, 9);
  const int64_t sizes[4] = {5, 3, 2, 4};
  const int64_t strides[4] = {1, 20, 60, 5};
  std::vector<float> out(120), want(120);
  strided_copy(out.data(), x.data(), sizeof(float), 4, sizes, strides);
  int64_t k = 0;
  for (int64_t a = 0; a < 5; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t c = 0; c < 2; ++c)
        for (int64_t d = 0; d < 4; ++d) want[k++] = x[a * 1 + b * 20 + c * 60 + d * 5];
  EXPECT_EQ(out, want);
  (void)s;
  // strided_add is its adjoint: <y, P x> == <P^T y, x>
  std::vector<float> acc(120, 0.0f);
  strided_add(acc.data(), out.data(), 4, sizes, strides);
  EXPECT_EQ(acc, x);
  // 6-D with a broadcast (0 stride), 2-byte elements, and a negative stride.
  std::vector<uint16_t> src(6);
  for (int i = 0; i < 6; ++i) src[i] = static_cast<uint16_t>(i);
  const int64_t sz6[6] = {1, 2, 1, 3, 2, 1};
  const int64_t st6[6] = {0, 0, 7, -2, 1, 0};
  std::vector<uint16_t> got(12);
  strided_copy(got.data(), src.data() + 4, 2, 6, sz6, st6);
  std::vector<uint16_t> exp6 = {4, 5, 2, 3, 0, 1, 4, 5, 2, 3, 0, 1};
  EXPECT_EQ(got, exp6);
  EXPECT_THROW(strided_copy(got.data(), src.data(), 2, 7, sz6, st6), InputError);
  // contiguous fast path and 0-d
  float one = 3.0f, dst = 0.0f;
  strided_copy(&dst, &one, 4, 0, nullptr, nullptr);
  EXPECT_EQ(dst, 3.0f);
}

}  // namespace
}  // namespace paratrain::kernels::cpu
