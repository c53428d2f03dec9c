// The bf16/f16 CPU kernels (kernels/cpu/half.h) through the dispatch tables, against the f32
// kernels on the same values.
//
// Method: inputs are drawn in f32 and rounded to T, so they are exactly representable in
// T; the f32 kernel runs on their widened values, the (cpu, T) kernel on the T bits. The
// half kernels promise round_T(f32 result), so the bound of an element is
//     |half - f32| <= u |f32| + tiny + slack
// with u the unit roundoff of T (round to nearest: 2^-8 for bf16's 8-bit significand,
// 2^-11 for f16's 11 bits), tiny half the subnormal spacing (2^-134 bf16, 2^-25 f16: the
// absolute error floor of rounding near 0), and slack what f32 arithmetic may reorder
// between the two runs (0 where the half kernel runs the very f32 code on the very same
// values; stated per test otherwise). Each test prints its largest error and the fraction
// of the bound it used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/half_util.h"
#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/kernels/cpu/half.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::kernels::cpu {
namespace {

using testing::randn;
using testing::uniform;
constexpr Device kCpu = Device::CPU;

const Registry& R() { return kernels::registry(); }

// Reference conversions: dtype.h's scalar ones (this test is not built with -march=native,
// so f16 goes through the compiler's _Float16 software conversion, independent of the
// kernels' own).
uint16_t round_h(DType t, float f) { return t == DType::BF16 ? paratrain::f32_to_bf16(f) : paratrain::f32_to_f16(f); }
float widen_h(DType t, uint16_t h) { return t == DType::BF16 ? paratrain::bf16_to_f32(h) : paratrain::f16_to_f32(h); }
double unit_roundoff(DType t) { return t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }
double tiny(DType t) { return t == DType::BF16 ? std::ldexp(1.0, -134) : std::ldexp(1.0, -25); }

// Values in T: h the bits, f the same values in f32.
struct HalfVec {
  std::vector<uint16_t> h;
  std::vector<float> f;
};
HalfVec in_half(DType t, const std::vector<float>& v) {
  HalfVec r{std::vector<uint16_t>(v.size()), std::vector<float>(v.size())};
  for (size_t i = 0; i < v.size(); ++i) {
    r.h[i] = round_h(t, v[i]);
    r.f[i] = widen_h(t, r.h[i]);
  }
  return r;
}
std::vector<float> widen_all(DType t, const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = widen_h(t, h[i]);
  return f;
}

// The largest errors seen per kernel (the first word of a check's name) and dtype, over all
// sizes and cases of a test; print_errors() writes them after each test.
struct ErrStat {
  double abs = 0, rel = 0, frac = 0;
  int checks = 0;
};
std::map<std::string, ErrStat>& errors() {
  static std::map<std::string, ErrStat> m;
  return m;
}
void record(const std::string& what, DType t, double abs, double rel, double frac) {
  ErrStat& e = errors()[what.substr(0, what.find(' ')) + " " + dtype_name(t)];
  e.abs = std::max(e.abs, abs);
  e.rel = std::max(e.rel, rel);
  e.frac = std::max(e.frac, frac);
  ++e.checks;
}
void print_errors() {
  for (const auto& [k, e] : errors())
    std::printf("  [half] %-26s max |half-f32| %-9.3g max rel %-9.3g %3.0f%% of the bound (%d checks)\n",
                k.c_str(), e.abs, e.rel, 100.0 * e.frac, e.checks);
  errors().clear();
}

// |got - want| <= mult * u |want| + tiny + slack[i] for every element; records the maximum.
::testing::AssertionResult within(const std::string& what, DType t, const std::vector<uint16_t>& got_h,
                                  const std::vector<float>& want, const std::vector<double>& slack,
                                  double mult = 1.0) {
  const auto got = widen_all(t, got_h);
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
  const double u = mult * unit_roundoff(t), tn = tiny(t);
  double worst_frac = 0.0, worst_rel = 0.0, worst_abs = 0.0;
  size_t bad = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (!(std::isnan(w) && std::isnan(g)) && bad == got.size()) bad = i;
      continue;
    }
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w && bad == got.size()) bad = i;
      continue;
    }
    const double d = std::abs(g - w), lim = u * std::abs(w) + tn + (slack.empty() ? 0.0 : slack[i]);
    worst_abs = std::max(worst_abs, d);
    if (w != 0.0) worst_rel = std::max(worst_rel, d / std::abs(w));
    worst_frac = std::max(worst_frac, d / lim);
    if (!(d <= lim) && bad == got.size()) bad = i;
  }
  record(what, t, worst_abs, worst_rel, worst_frac);
  if (bad == got.size()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << dtype_name(t) << ": element " << bad
                                       << " is " << got[bad] << ", f32 gives " << want[bad]
                                       << " (bound u=" << u << ")";
}
::testing::AssertionResult within(const std::string& what, DType t, const std::vector<uint16_t>& got,
                                  const std::vector<float>& want, double slack = 0.0) {
  return within(what, t, got, want, std::vector<double>(want.size(), slack));
}

class HalfKernels : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { set_num_threads(1); }
  void TearDown() override {
    set_num_threads(1);
    print_errors();
  }
};

std::string type_name(const ::testing::TestParamInfo<DType>& p) { return dtype_name(p.param); }

// ---------------------------------------------------------------------------------------
// Conversions. Every implementation this CPU runs (avx2-f16c, scalar) gives the reference
// bits: all 65536 patterns widened; narrowing of ties, subnormals, overflow, inf, NaN and a
// million random bit patterns (NaN compared as NaN: payloads may differ).
TEST(HalfConvert, EveryImplementationMatchesTheScalarReference) {
  const detail::ConvertImpl* impls[4];
  const int n = detail::convert_impls(impls, 4);
  ASSERT_GE(n, 1);
  std::printf("  [half] conversion path chosen: %s (%d implementations on this CPU)\n",
              half_convert_path(), n);
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> special = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 1e30f,
                                -1e30f, std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                                std::numeric_limits<float>::min(), 5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f,
                                1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11),
                                1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                                3.3895314e38f /* rounds to bf16 inf */};
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = rng();
    if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  // bf16 ties
    if (i % 4 == 2) u = (u & 0x8fffe000u) | 0x38000000u | 0x1000u;  // f16 range, f16 ties
    float f;
    std::memcpy(&f, &u, 4);
    special.push_back(f);
  }
  for (int k = 0; k < n; ++k) {
    const auto& im = *impls[k];
    std::vector<float> wide(65536);
    for (DType t : {DType::BF16, DType::F16}) {
      (t == DType::BF16 ? im.bf16_to_f32 : im.f16_to_f32)(wide.data(), all.data(), 65536);
      for (int i = 0; i < 65536; ++i) {
        const float want = widen_h(t, all[i]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(wide[i])) << im.name << " " << dtype_name(t) << " " << i;
        } else {
          ASSERT_EQ(std::memcmp(&wide[i], &want, 4), 0) << im.name << " " << dtype_name(t) << " pattern " << i;
        }
      }
      std::vector<uint16_t> nar(special.size());
      (t == DType::BF16 ? im.f32_to_bf16 : im.f32_to_f16)(nar.data(), special.data(), special.size());
      for (size_t i = 0; i < special.size(); ++i) {
        const uint16_t want = round_h(t, special[i]);
        if (std::isnan(special[i])) {
          ASSERT_TRUE(std::isnan(widen_h(t, nar[i]))) << im.name << " " << dtype_name(t);
        } else {
          ASSERT_EQ(nar[i], want) << im.name << " " << dtype_name(t) << " of " << special[i];
        }
      }
    }
  }
}

// The registered casts (threaded above 32 Ki elements) give the reference bits.
TEST_P(HalfKernels, CastsAreTheReferenceAtAnySizeAndThreadCount) {
  const DType t = GetParam();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int64_t n : {1, 7, 8, 9, 100003}) {
      auto x = randn(n, 11, 3.0f);
      std::vector<uint16_t> h(n);
      std::vector<float> back(n);
      R().cast_from_f32.at(kCpu, t)(h.data(), x.data(), n);
      R().cast_to_f32.at(kCpu, t)(back.data(), h.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(h[i], round_h(t, x[i])) << n << " " << i;
        ASSERT_EQ(back[i], widen_h(t, h[i])) << n << " " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Elementwise: the half kernel runs the f32 kernel on the same values and rounds once, so
// slack 0: |half - f32| <= u |f32| + tiny (1 ulp of T at most; in fact round_T(f32)).
TEST_P(HalfKernels, ElementwiseWithinOneRoundingOfF32) {
  const DType t = GetParam();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1025}, int64_t{70001}}) {
    const auto a = in_half(t, randn(n, 1, 2.0f)), b = in_half(t, randn(n, 2, 2.0f));
    const auto acc = in_half(t, randn(n, 3));
    const auto o = in_half(t, uniform(n, 4, -0.99f, 0.99f));  // an activation's output
    std::vector<uint8_t> mask(n);
    for (int64_t i = 0; i < n; ++i) mask[i] = static_cast<uint8_t>((i * 7 + 3) % 5 != 0);
    const std::string sz = " n=" + std::to_string(n);
    std::vector<uint16_t> h(n);
    std::vector<float> f(n);
    auto unary = [&](const char* name, auto Registry::*table) {
      (R().*table).at(kCpu, t)(h.data(), a.h.data(), n);
      (R().*table).at(kCpu, DType::F32)(f.data(), a.f.data(), n);
      EXPECT_TRUE(within(name + sz, t, h, f));
      std::vector<uint16_t> in_place = a.h;  // out == in
      (R().*table).at(kCpu, t)(in_place.data(), in_place.data(), n);
      EXPECT_EQ(in_place, h) << name << " in place";
    };
    unary("relu_forward", &Registry::relu_forward);
    unary("gelu_forward", &Registry::gelu_forward);
    unary("tanh_forward", &Registry::tanh_forward);
    unary("sigmoid_forward", &Registry::sigmoid_forward);
    auto binary = [&](const char* name, auto Registry::*table) {
      (R().*table).at(kCpu, t)(h.data(), a.h.data(), b.h.data(), n);
      (R().*table).at(kCpu, DType::F32)(f.data(), a.f.data(), b.f.data(), n);
      EXPECT_TRUE(within(name + sz, t, h, f));
      std::vector<uint16_t> in_place = a.h;  // out == a
      (R().*table).at(kCpu, t)(in_place.data(), in_place.data(), b.h.data(), n);
      EXPECT_EQ(in_place, h) << name << " in place";
    };
    binary("add", &Registry::add);
    binary("sub", &Registry::sub);
    binary("mul", &Registry::mul);
    // accumulating kernels: acc += g(x, y); the f32 kernel accumulates into the same old
    // values, so the one rounding of the += is the whole difference
    auto accum = [&](const char* name, auto Registry::*table, const HalfVec& x, const HalfVec& y) {
      h = acc.h;
      f = acc.f;
      (R().*table).at(kCpu, t)(h.data(), x.h.data(), y.h.data(), n);
      (R().*table).at(kCpu, DType::F32)(f.data(), x.f.data(), y.f.data(), n);
      EXPECT_TRUE(within(name + sz, t, h, f));
    };
    accum("mul_acc", &Registry::mul_acc, a, b);
    accum("relu_backward", &Registry::relu_backward, b, a);
    accum("gelu_backward", &Registry::gelu_backward, b, a);
    accum("tanh_backward", &Registry::tanh_backward, b, o);
    accum("sigmoid_backward", &Registry::sigmoid_backward, b, o);

    R().scale.at(kCpu, t)(h.data(), a.h.data(), 0.37f, n);
    R().scale.at(kCpu, DType::F32)(f.data(), a.f.data(), 0.37f, n);
    EXPECT_TRUE(within("scale" + sz, t, h, f));
    h = acc.h;
    f = acc.f;
    R().axpy.at(kCpu, t)(h.data(), a.h.data(), -1.7f, n);
    R().axpy.at(kCpu, DType::F32)(f.data(), a.f.data(), -1.7f, n);
    EXPECT_TRUE(within("axpy" + sz, t, h, f));
    R().dropout_forward.at(kCpu, t)(h.data(), a.h.data(), mask.data(), 1.25f, n);
    R().dropout_forward.at(kCpu, DType::F32)(f.data(), a.f.data(), mask.data(), 1.25f, n);
    EXPECT_TRUE(within("dropout_forward" + sz, t, h, f));
    h = acc.h;
    f = acc.f;
    R().dropout_backward.at(kCpu, t)(h.data(), b.h.data(), mask.data(), 1.25f, n);
    R().dropout_backward.at(kCpu, DType::F32)(f.data(), b.f.data(), mask.data(), 1.25f, n);
    EXPECT_TRUE(within("dropout_backward" + sz, t, h, f));

    R().fill.at(kCpu, t)(h.data(), 0.1f, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[i], round_h(t, 0.1f));
    R().copy.at(kCpu, t)(h.data(), a.h.data(), n);
    EXPECT_EQ(h, a.h);
    R().copy.at(kCpu, t)(h.data(), h.data(), n);  // out == in: unchanged
    EXPECT_EQ(h, a.h);
  }
}

// The threaded path (2 threads over 200 Ki elements) gives the same bits as 1 thread.
TEST_P(HalfKernels, ElementwiseDoesNotDependOnTheThreadCount) {
  const DType t = GetParam();
  const int64_t n = 200003;
  const auto a = in_half(t, randn(n, 5)), g = in_half(t, randn(n, 6));
  std::vector<uint16_t> out[2], grad[2];
  for (int k = 0; k < 2; ++k) {
    set_num_threads(k + 1);
    out[k].resize(n);
    grad[k] = g.h;
    R().gelu_forward.at(kCpu, t)(out[k].data(), a.h.data(), n);
    R().gelu_backward.at(kCpu, t)(grad[k].data(), g.h.data(), a.h.data(), n);
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(grad[0], grad[1]);
}

// bias_add: one f32 addition per element, rounded once (slack 0). bias_backward sums the
// rows in f32 in the f32 kernel's order and adds to the old dbias once: equal to the f32
// kernel's result up to that one rounding (slack 0), at 1 and 2 threads.
TEST_P(HalfKernels, BiasAddAndBackward) {
  const DType t = GetParam();
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {37, 300}, {5, 1030}, {300, 17}}) {
    const auto out0 = in_half(t, randn(N * C, 7)), bias = in_half(t, randn(C, 8));
    std::vector<uint16_t> h = out0.h;
    std::vector<float> f = out0.f;
    R().bias_add.at(kCpu, t)(h.data(), bias.h.data(), N, C);
    R().bias_add.at(kCpu, DType::F32)(f.data(), bias.f.data(), N, C);
    const std::string sz = " " + std::to_string(N) + "x" + std::to_string(C);
    EXPECT_TRUE(within("bias_add" + sz, t, h, f));
    const auto db0 = in_half(t, randn(C, 9));
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<uint16_t> dh = db0.h;
      std::vector<float> df = db0.f;
      R().bias_backward.at(kCpu, t)(dh.data(), out0.h.data(), N, C);
      R().bias_backward.at(kCpu, DType::F32)(df.data(), out0.f.data(), N, C);
      EXPECT_TRUE(within("bias_backward" + sz + " thr=" + std::to_string(threads), t, dh, df));
    }
  }
}

// strided_add through a transposed view: one f32 addition per element, rounded once.
TEST_P(HalfKernels, StridedAddIntoATransposedView) {
  const DType t = GetParam();
  const int64_t sizes[2] = {5, 4}, strides[2] = {1, 5};  // the transpose of a (4,5) matrix
  const auto out0 = in_half(t, randn(20, 10)), inp = in_half(t, randn(20, 11));
  std::vector<uint16_t> h = out0.h;
  std::vector<float> f = out0.f;
  R().strided_add.at(kCpu, t)(h.data(), inp.h.data(), 2, sizes, strides);
  R().strided_add.at(kCpu, DType::F32)(f.data(), inp.f.data(), 2, sizes, strides);
  EXPECT_TRUE(within("strided_add", t, h, f));
  const int64_t zero_strides[2] = {0, 1};
  EXPECT_THROW(R().strided_add.at(kCpu, t)(h.data(), inp.h.data(), 2, sizes, zero_strides), InputError);
}

// ---------------------------------------------------------------------------------------
// Reductions: the widened values are exact, both sums are in double over the same 16 Ki
// chunks; only the order inside a chunk may differ: |half - f32| <= 1e-12 sum|x|. The
// result is the same at 1 and 2 threads.
TEST_P(HalfKernels, SumAndSumSquares) {
  const DType t = GetParam();
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{300001}}) {
    const auto x = in_half(t, randn(n, 12));
    double abs_sum = 0.0, sq = 0.0;
    for (float v : x.f) abs_sum += std::abs(v), sq += double(v) * v;
    double s[2], q[2];
    for (int k = 0; k < 2; ++k) {
      set_num_threads(k + 1);
      s[k] = R().sum.at(kCpu, t)(x.h.data(), n);
      q[k] = R().sum_squares.at(kCpu, t)(x.h.data(), n);
    }
    const double sf = R().sum.at(kCpu, DType::F32)(x.f.data(), n);
    const double qf = R().sum_squares.at(kCpu, DType::F32)(x.f.data(), n);
    EXPECT_NEAR(s[0], sf, 1e-12 * abs_sum) << n;
    EXPECT_NEAR(q[0], qf, 1e-12 * sq) << n;
    EXPECT_EQ(s[0], s[1]) << n;
    EXPECT_EQ(q[0], q[1]) << n;
    std::printf("  [half] sum / sum_squares n=%-7lld %-4s |half-f32| %.3g / %.3g\n",
                static_cast<long long>(n), dtype_name(t), std::abs(s[0] - sf), std::abs(q[0] - qf));
  }
}

TEST_P(HalfKernels, AllFiniteSeesInfAndNanInT) {
  const DType t = GetParam();
  const uint16_t pinf = t == DType::BF16 ? 0x7f80 : 0x7c00, ninf = pinf | 0x8000;
  const uint16_t qnan = t == DType::BF16 ? 0x7fc0 : 0x7e00, snan = pinf | 1;
  const uint16_t maxf = t == DType::BF16 ? 0x7f7f : 0x7bff;  // largest finite
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{100000}}) {
    auto x = in_half(t, randn(n, 13)).h;
    EXPECT_TRUE(R().all_finite.at(kCpu, t)(x.data(), n));
    x[n / 2] = maxf;
    x[0] = maxf | 0x8000;
    EXPECT_TRUE(R().all_finite.at(kCpu, t)(x.data(), n)) << "the largest finite values are finite";
    for (uint16_t bad : {pinf, ninf, qnan, snan, static_cast<uint16_t>(qnan | 0x8000)})
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        auto y = x;
        y[at] = bad;
        EXPECT_FALSE(R().all_finite.at(kCpu, t)(y.data(), n)) << std::hex << bad << " at " << std::dec << at;
      }
  }
  EXPECT_TRUE(R().all_finite.at(kCpu, t)(nullptr, 0));
}

// ---------------------------------------------------------------------------------------
// GEMM, f32 accumulation. The widening path runs dnnl_sgemm on the same values as the f32
// reference call, but with compact leading dimensions, which may change oneDNN's blocking:
// slack_ij = 2 K 2^-24 (|alpha| sum_k |a_ik||b_kj| + |beta c_ij|), the f32 reassociation
// bound. So: within one rounding of T of the f32 GEMM (round_T(f32) but at near-ties).
std::vector<double> gemm_slack(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                               const std::vector<float>& A, int64_t lda, const std::vector<float>& B,
                               int64_t ldb, float beta, const std::vector<float>& C, int64_t ldc) {
  std::vector<double> s(M * ldc, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double m = 0.0;
      for (int64_t k = 0; k < K; ++k)
        m += std::abs(double(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]));
      const double c = beta == 0.0f ? 0.0 : std::abs(double(beta) * C[i * ldc + j]);
      s[i * ldc + j] = 2.0 * (K + 1) * std::ldexp(1.0, -24) * (std::abs(alpha) * m + c);
    }
  return s;
}

TEST_P(HalfKernels, GemmAllTransposesPaddedStridesAndBeta) {
  const DType t = GetParam();
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {64, 96, 200}, {3, 100, 1}, {5, 4, 0}};
  for (auto& s : sizes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 1.0f, -0.5f}) {
          const int64_t M = s[0], N = s[1], K = s[2];
          const int64_t lda = std::max<int64_t>(1, (ta ? M : K) + 3), ldb = std::max<int64_t>(1, (tb ? K : N) + 1), ldc = N + 2;
          const auto A = in_half(t, randn((ta ? K : M) * lda, 1)), B = in_half(t, randn((tb ? N : K) * ldb, 2));
          auto C = in_half(t, randn(M * ldc, 3));
          if (beta == 0.0f) {  // beta 0 ignores C, NaN included
            for (auto& v : C.h) v = t == DType::BF16 ? 0x7fc0 : 0x7e00;
            for (auto& v : C.f) v = NAN;
          }
          std::vector<uint16_t> h = C.h;
          std::vector<float> f = C.f;
          R().gemm.at(kCpu, t)(ta, tb, M, N, K, 0.5f, A.h.data(), lda, B.h.data(), ldb, beta, h.data(), ldc);
          R().gemm.at(kCpu, DType::F32)(ta, tb, M, N, K, 0.5f, A.f.data(), lda, B.f.data(), ldb, beta, f.data(), ldc);
          auto slack = gemm_slack(ta, tb, M, N, K, 0.5f, A.f, lda, B.f, ldb, beta, C.f, ldc);
          // the padding columns of C are untouched
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = N; j < ldc; ++j) {
              ASSERT_EQ(h[i * ldc + j], C.h[i * ldc + j]);
              f[i * ldc + j] = widen_h(t, C.h[i * ldc + j]);
            }
          char name[96];
          std::snprintf(name, sizeof name, "gemm %lldx%lldx%lld ta=%d tb=%d beta=%g", (long long)M,
                        (long long)N, (long long)K, ta, tb, beta);
          EXPECT_TRUE(within(name, t, h, f, slack));
        }
}

TEST_P(HalfKernels, GemmBatchedWithASharedOperandAndBetaOne) {
  const DType t = GetParam();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (auto [M, N, K, batch] : {std::array<int64_t, 4>{9, 11, 6, 5}, {64, 64, 64, 3}, {2, 3, 4, 40}}) {
      const auto A = in_half(t, randn(M * K, 4));  // shared by every matrix (stride 0)
      const auto B = in_half(t, randn(batch * K * N, 5));
      const auto C = in_half(t, randn(batch * M * N, 6));
      std::vector<uint16_t> h = C.h;
      std::vector<float> f = C.f;
      R().gemm_batched.at(kCpu, t)(false, true, M, N, K, 1.0f, A.h.data(), K, B.h.data(), K, 1.0f,
                                   h.data(), N, batch, 0, K * N, M * N);
      R().gemm_batched.at(kCpu, DType::F32)(false, true, M, N, K, 1.0f, A.f.data(), K, B.f.data(), K,
                                            1.0f, f.data(), N, batch, 0, K * N, M * N);
      std::vector<double> slack;
      for (int64_t b = 0; b < batch; ++b) {
        std::vector<float> Bb(B.f.begin() + b * K * N, B.f.begin() + (b + 1) * K * N);
        std::vector<float> Cb(C.f.begin() + b * M * N, C.f.begin() + (b + 1) * M * N);
        auto s = gemm_slack(false, true, M, N, K, 1.0f, A.f, K, Bb, K, 1.0f, Cb, N);
        slack.insert(slack.end(), s.begin(), s.end());
      }
      char name[96];
      std::snprintf(name, sizeof name, "gemm_batched %lldx%lldx%lld b=%lld thr=%d", (long long)M,
                    (long long)N, (long long)K, (long long)batch, threads);
      EXPECT_TRUE(within(name, t, h, f, slack));
    }
  }
}

TEST_P(HalfKernels, GemmPathIsNamed) {
  const DType t = GetParam();
  const std::string p = gemm_path(t);
  if (t == DType::BF16)
    EXPECT_EQ(p, cpu_has_native_bf16() ? "onednn-bf16-native" : "widen-f32");
  else
    EXPECT_EQ(p, "widen-f32");
  std::printf("  [half] gemm path for %s on this CPU: %s\n", dtype_name(t), p.c_str());
  EXPECT_THROW(R().gemm.at(kCpu, t)(false, false, -1, 1, 1, 1.0f, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1),
               InputError);
  EXPECT_THROW(R().gemm.at(kCpu, t)(false, false, 2, 3, 4, 1.0f, nullptr, 3, nullptr, 3, 0.0f, nullptr, 3),
               InputError);  // lda < K
}

// The native path's oneDNN matmul call (strided memory descriptors for the transposes and
// padded leading dimensions, alpha as output scale, beta as sum post-op), run on f32 memory
// so every CPU checks it: equal to dnnl_sgemm up to f32 reassociation (slack as above).
TEST(HalfGemm, NativePathMatmulCallIsRightOnF32) {
  set_num_threads(1);
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {64, 48, 96}};
  for (auto& s : sizes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 1.0f, 2.0f}) {
          const int64_t M = s[0], N = s[1], K = s[2];
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
          auto A = randn((ta ? K : M) * lda, 1), B = randn((tb ? N : K) * ldb, 2), C = randn(M * ldc, 3);
          if (beta == 0.0f)
            for (auto& v : C) v = NAN;
          auto got = C, want = C;
          detail::onednn_matmul_f32(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
          gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
          auto slack = gemm_slack(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, ldc);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t k = i * ldc + j;
              if (j >= N) {
                ASSERT_TRUE(std::memcmp(&got[k], &C[k], 4) == 0) << "padding written";
                continue;
              }
              ASSERT_LE(std::abs(double(got[k]) - want[k]), slack[k] + 1e-30)
                  << M << "x" << N << "x" << K << " ta=" << ta << " tb=" << tb << " beta=" << beta;
            }
        }
}

// Native bf16 (oneDNN on AVX512-BF16/AMX) against the widening path: both round an f32
// accumulation of the same products once, so they agree within 1 ulp of bf16 (2u |x|) plus
// the f32 reassociation slack.
// On a CPU with native bf16 the two paths agree; on one without, the native path refuses to
// run (InputError) and the dispatched bf16 GEMM is the widening one: both are checked, on
// whichever CPU this runs.
TEST(HalfGemm, NativeBf16MatchesTheWideningPath) {
  if (!cpu_has_native_bf16()) {
    std::printf("  this CPU has no avx512bf16 (nor amx-bf16): checking that the native path refuses\n");
    const uint16_t one = paratrain::f32_to_bf16(1.0f);
    uint16_t c = 0;
    EXPECT_THROW(half::gemm_bf16_native(false, false, 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1), InputError);
    EXPECT_STREQ(gemm_path(DType::BF16), "widen-f32");
    return;
  }
  EXPECT_STREQ(gemm_path(DType::BF16), "onednn-bf16-native");
  set_num_threads(1);
  const DType t = DType::BF16;
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {128, 96, 384}};
  for (auto& s : sizes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 1.0f}) {
          const int64_t M = s[0], N = s[1], K = s[2];
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
          const auto A = in_half(t, randn((ta ? K : M) * lda, 1)), B = in_half(t, randn((tb ? N : K) * ldb, 2));
          const auto C = in_half(t, randn(M * ldc, 3));
          std::vector<uint16_t> nat = C.h, wid = C.h;
          half::gemm_bf16_native(ta, tb, M, N, K, 0.5f, A.h.data(), lda, B.h.data(), ldb, beta, nat.data(), ldc);
          half::gemm_bf16_widen(ta, tb, M, N, K, 0.5f, A.h.data(), lda, B.h.data(), ldb, beta, wid.data(), ldc);
          auto slack = gemm_slack(ta, tb, M, N, K, 0.5f, A.f, lda, B.f, ldb, beta, C.f, ldc);
          char name[96];
          std::snprintf(name, sizeof name, "native vs widen %lldx%lldx%lld ta=%d tb=%d beta=%g",
                        (long long)M, (long long)N, (long long)K, ta, tb, beta);
          EXPECT_TRUE(within(name, t, nat, widen_all(t, wid), slack, 2.0));
        }
  print_errors();
}

// ---------------------------------------------------------------------------------------
// Attention: the half kernel widens qkv (and dout, out, dqkv) and runs the f32 kernel on
// the same values at the same thread count: slack 0 for out and dqkv (one rounding; dqkv's
// += is inside the f32 kernel, rounded once at the end); lse is f32 and equal.
TEST_P(HalfKernels, AttentionForwardAndBackward) {
  const DType t = GetParam();
  for (int threads : {1, 2})
    for (int64_t T : {1, 5, 65, 130}) {
      set_num_threads(threads);
      const int64_t B = 2, C = 32, NH = 4;
      const auto qkv = in_half(t, randn(B * T * 3 * C, 20, 0.7f));
      std::vector<uint16_t> out(B * T * C);
      std::vector<float> outf(B * T * C), lse(B * NH * T), lsef(B * NH * T);
      R().attention_forward.at(kCpu, t)(out.data(), lse.data(), qkv.h.data(), B, T, C, NH);
      R().attention_forward.at(kCpu, DType::F32)(outf.data(), lsef.data(), qkv.f.data(), B, T, C, NH);
      const std::string sz = " T=" + std::to_string(T) + " thr=" + std::to_string(threads);
      EXPECT_TRUE(within("attention_forward out" + sz, t, out, outf));
      EXPECT_EQ(lse, lsef) << "lse is the f32 kernel's";
      const auto dout = in_half(t, randn(B * T * C, 21));
      const auto dqkv0 = in_half(t, randn(B * T * 3 * C, 22, 0.1f));
      const auto outw = widen_all(t, out);  // the forward output the backward sees, in T
      std::vector<uint16_t> dq = dqkv0.h;
      std::vector<float> dqf = dqkv0.f;
      R().attention_backward.at(kCpu, t)(dq.data(), dout.h.data(), qkv.h.data(), out.data(), lse.data(), B, T, C, NH);
      R().attention_backward.at(kCpu, DType::F32)(dqf.data(), dout.f.data(), qkv.f.data(), outw.data(), lse.data(), B, T, C, NH);
      EXPECT_TRUE(within("attention_backward dqkv" + sz, t, dq, dqf));
    }
}

// ---------------------------------------------------------------------------------------
// conv2d and max-pool: the f32 kernel on the widened operands, outputs and gradients
// rounded once (slack 0); each gradient may be nullptr.
TEST_P(HalfKernels, Conv2dForwardAndBackwardWithNullGradients) {
  const DType t = GetParam();
  const int64_t N = 2, Ci = 3, H = 9, W = 7, Co = 4, K = 3, stride = 2, pad = 1;
  const int64_t Ho = conv2d_out_size(H, K, stride, pad), Wo = conv2d_out_size(W, K, stride, pad);
  const auto inp = in_half(t, randn(N * Ci * H * W, 30)), w = in_half(t, randn(Co * Ci * K * K, 31, 0.3f));
  const auto bias = in_half(t, randn(Co, 32));
  for (bool with_bias : {true, false}) {
    std::vector<uint16_t> out(N * Co * Ho * Wo);
    std::vector<float> outf(out.size());
    R().conv2d_forward.at(kCpu, t)(out.data(), inp.h.data(), w.h.data(), with_bias ? bias.h.data() : nullptr,
                                   N, Ci, H, W, Co, K, stride, pad);
    R().conv2d_forward.at(kCpu, DType::F32)(outf.data(), inp.f.data(), w.f.data(), with_bias ? bias.f.data() : nullptr,
                                            N, Ci, H, W, Co, K, stride, pad);
    EXPECT_TRUE(within(with_bias ? "conv2d_forward" : "conv2d_forward (no bias)", t, out, outf));
  }
  const auto dout = in_half(t, randn(N * Co * Ho * Wo, 33));
  const auto di0 = in_half(t, randn(N * Ci * H * W, 34, 0.1f)), dw0 = in_half(t, randn(Co * Ci * K * K, 35, 0.1f));
  const auto db0 = in_half(t, randn(Co, 36, 0.1f));
  // which of dinp, dweight, dbias are wanted
  for (int wanted : {7, 2, 5, 1}) {
    const bool wi = wanted & 4, ww = wanted & 2, wb = wanted & 1;
    std::vector<uint16_t> di = di0.h, dw = dw0.h, db = db0.h;
    std::vector<float> dif = di0.f, dwf = dw0.f, dbf = db0.f;
    R().conv2d_backward.at(kCpu, t)(wi ? di.data() : nullptr, ww ? dw.data() : nullptr, wb ? db.data() : nullptr,
                                    dout.h.data(), inp.h.data(), w.h.data(), N, Ci, H, W, Co, K, stride, pad);
    R().conv2d_backward.at(kCpu, DType::F32)(wi ? dif.data() : nullptr, ww ? dwf.data() : nullptr,
                                             wb ? dbf.data() : nullptr, dout.f.data(), inp.f.data(), w.f.data(),
                                             N, Ci, H, W, Co, K, stride, pad);
    const std::string tag = " (wanted" + std::string(wi ? " dinp" : "") + (ww ? " dweight" : "") + (wb ? " dbias" : "") + ")";
    EXPECT_TRUE(within("conv2d_backward dinp" + tag, t, di, dif));
    EXPECT_TRUE(within("conv2d_backward dweight" + tag, t, dw, dwf));
    EXPECT_TRUE(within("conv2d_backward dbias" + tag, t, db, dbf));
    if (!wi) EXPECT_EQ(di, di0.h);
    if (!ww) EXPECT_EQ(dw, dw0.h);
    if (!wb) EXPECT_EQ(db, db0.h);
  }
  std::vector<uint16_t> out(N * Co * Ho * Wo);
  EXPECT_THROW(R().conv2d_forward.at(kCpu, t)(out.data(), inp.h.data(), w.h.data(), nullptr, N, Ci, H, W, Co,
                                              K, 0, pad), InputError);
}

TEST_P(HalfKernels, MaxPoolForwardAndBackward) {
  const DType t = GetParam();
  const int64_t N = 2, C = 3, H = 8, W = 7, K = 3, stride = 2, pad = 1;
  const int64_t Ho = conv2d_out_size(H, K, stride, pad), Wo = conv2d_out_size(W, K, stride, pad);
  const auto inp = in_half(t, randn(N * C * H * W, 40));
  std::vector<uint16_t> out(N * C * Ho * Wo);
  std::vector<float> outf(out.size());
  std::vector<int32_t> am(out.size()), amf(out.size());
  R().maxpool2d_forward.at(kCpu, t)(out.data(), am.data(), inp.h.data(), N, C, H, W, K, stride, pad);
  R().maxpool2d_forward.at(kCpu, DType::F32)(outf.data(), amf.data(), inp.f.data(), N, C, H, W, K, stride, pad);
  EXPECT_EQ(widen_all(t, out), outf) << "the max of T values is one of them: exact";
  EXPECT_EQ(am, amf);
  const auto dout = in_half(t, randn(out.size(), 41)), di0 = in_half(t, randn(N * C * H * W, 42));
  std::vector<uint16_t> di = di0.h;
  std::vector<float> dif = di0.f;
  R().maxpool2d_backward.at(kCpu, t)(di.data(), dout.h.data(), am.data(), N, C, H, W, Ho, Wo);
  R().maxpool2d_backward.at(kCpu, DType::F32)(dif.data(), dout.f.data(), amf.data(), N, C, H, W, Ho, Wo);
  EXPECT_TRUE(within("maxpool2d_backward", t, di, dif));
}

// The f32-only kernels of the mixed-precision policy have no half entry. (Cross-entropy on
// half logits is registered elsewhere, src/kernels/cpu/half_loss.cpp, so it is not checked.)
TEST_P(HalfKernels, PolicyF32OnlyKernelsHaveNoHalfEntry) {
  const DType t = GetParam();
  EXPECT_FALSE(R().layernorm_forward.has(kCpu, t));
  EXPECT_FALSE(R().softmax_forward.has(kCpu, t));
  EXPECT_FALSE(R().log_softmax_forward.has(kCpu, t));
  EXPECT_FALSE(R().embedding_forward.has(kCpu, t));
  EXPECT_FALSE(R().encoder_forward.has(kCpu, t));
  EXPECT_FALSE(R().adamw_update.has(kCpu, t));
  EXPECT_FALSE(R().sgd_update.has(kCpu, t));
  EXPECT_THROW(R().layernorm_forward.at(kCpu, t), NoKernelError);
  EXPECT_TRUE(R().gemm.has(kCpu, t) && R().attention_backward.has(kCpu, t) && R().conv2d_backward.has(kCpu, t) &&
              R().all_finite.has(kCpu, t) && R().strided_add.has(kCpu, t));
}

INSTANTIATE_TEST_SUITE_P(Types, HalfKernels, ::testing::Values(DType::BF16, DType::F16), type_name);

}  // namespace
}  // namespace paratrain::kernels::cpu
