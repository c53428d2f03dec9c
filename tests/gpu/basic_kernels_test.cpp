// The basic CUDA kernels (src/kernels/cuda: GEMM, elementwise, casts, reductions,
// embedding, optimizers) through the dispatch tables, against the CPU kernels of the same
// (table, dtype) on the same inputs (fixed seeds; cudaMemcpy in and out).
//
// Tolerances, |cuda - cpu| <= rel |cpu| + abs per element (both NaN counts as equal):
//  - f32, the same operations in the same order (fill, copy, add, sub, mul, scale, relu,
//    dropout forward, embedding/encoder forward, casts): bit-exact (rel = abs = 0);
//  - f32 with a possible FMA contraction on either side or libm-class transcendentals
//    (2 ulp each side): rel 2e-6, abs 1e-6 (inputs and accumulators are O(1));
//  - bf16 / f16 results, rounded once from f32 values that may differ in the last f32 bit:
//    one unit in the last place of T (rel 2^-7 bf16, 2^-10 f16) plus abs 1e-6;
//  - f32 GEMM (K <= 512): rel 1e-4 with abs 1e-4 (sums of K products in another order);
//    bf16/f16 GEMM: rel 1e-2, abs 1e-2;
//  - sum / sum_squares: rel 1e-6 (both accumulate in double); bias_backward (f32 column
//    sums in another order): 1e-6 * N * max|dout| + 1e-6; the embedding scatter (the CPU's
//    order): exact; the optimizers: rel 1e-6 (abs 1e-8 / 1e-7 near 0);
//  - orthogonalize_columns (double arithmetic, sums in another order, one f32 rounding):
//    rel 1e-6 (an f32 rounding of values that differ in double's last bits), abs 1e-9.
// Every test starts with PT_REQUIRE_GPU() and skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <memory>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels {
namespace {

constexpr Device kCpu = Device::CPU, kGpu = Device::CUDA;
const Registry& R() { return registry(); }
using test::DevBuf;


// An array of n elements of dtype t as raw bytes.
using Bytes = std::vector<uint8_t>;

float decode(DType t, const Bytes& b, size_t i) {
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// n values uniform in [lo, hi], rounded to t.
Bytes random_array(DType t, int64_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Bytes b(static_cast<size_t>(n) * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) {
    const float f = u(rng);
    if (t == DType::F32) {
      std::memcpy(b.data() + 4 * i, &f, 4);
    } else {
      const uint16_t h = t == DType::BF16 ? f32_to_bf16(f) : f32_to_f16(f);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

struct Tol {
  double rel = 0, abs = 0;
};
Tol half_ulp(DType t, Tol f32) {
  if (t == DType::BF16) return {0x1p-7, 1e-6};
  if (t == DType::F16) return {0x1p-10, 1e-6};
  return f32;
}

// Expects got == want within tol elementwise; reports the first few failures.
void expect_close(DType t, const Bytes& got, const Bytes& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const size_t n = got.size() / dtype_size(t);
  int failures = 0;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = decode(t, got, i), w = decode(t, want, i);
    if (std::isnan(g) && std::isnan(w)) continue;
    const double err = std::fabs(g - w);
    worst = std::max(worst, err);
    if (!(err <= tol.rel * std::fabs(w) + tol.abs) && failures++ < 5)
      ADD_FAILURE() << what << " (" << dtype_name(t) << ") element " << i << " of " << n << ": cuda " << g
                    << " cpu " << w << " (err " << err << ")";
  }
  EXPECT_EQ(failures, 0) << what << " (" << dtype_name(t) << "): " << failures << " of " << n
                         << " elements out of tolerance, worst error " << worst;
}

const DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};
const int64_t kSizes[] = {1, 1000, 1000003};

// ---- elementwise: out (initialised randomly), up to two inputs, a 0/1 mask ----
using Call = std::function<void(Device, DType, void* out, const void* a, const void* b, const uint8_t* mask,
                                int64_t n)>;

void check_elementwise(const char* what, Call call, Tol f32_tol) {
  for (DType t : kFloatTypes) {
    for (int64_t n : kSizes) {
      const Bytes out0 = random_array(t, n, 1), a = random_array(t, n, 2), b = random_array(t, n, 3);
      std::vector<uint8_t> mask(static_cast<size_t>(n));
      std::mt19937 rng(4);
      for (auto& m : mask) m = static_cast<uint8_t>(rng() % 10 != 0);
      Bytes want = out0;
      call(kCpu, t, want.data(), a.data(), b.data(), mask.data(), n);
      DevBuf d_out(out0), d_a(a), d_b(b), d_mask(mask);
      call(kGpu, t, d_out.p, d_a.p, d_b.p, static_cast<const uint8_t*>(d_mask.p), n);
      expect_close(t, d_out.get<uint8_t>(), want, half_ulp(t, f32_tol), std::string(what) + " n=" + std::to_string(n));
    }
  }
}

const Tol kExact{0, 0}, kLoose{2e-6, 1e-6};

TEST(CudaBasicKernels, Arithmetic) {
  PT_REQUIRE_GPU();
  check_elementwise("fill", [](Device d, DType t, void* o, const void*, const void*, const uint8_t*, int64_t n) {
    R().fill.at(d, t)(o, 0.37f, n);
  }, kExact);
  check_elementwise("copy", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t*, int64_t n) {
    R().copy.at(d, t)(o, a, n);
  }, kExact);
  check_elementwise("add", [](Device d, DType t, void* o, const void* a, const void* b, const uint8_t*, int64_t n) {
    R().add.at(d, t)(o, a, b, n);
  }, kExact);
  check_elementwise("sub", [](Device d, DType t, void* o, const void* a, const void* b, const uint8_t*, int64_t n) {
    R().sub.at(d, t)(o, a, b, n);
  }, kExact);
  check_elementwise("mul", [](Device d, DType t, void* o, const void* a, const void* b, const uint8_t*, int64_t n) {
    R().mul.at(d, t)(o, a, b, n);
  }, kExact);
  check_elementwise("scale", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t*, int64_t n) {
    R().scale.at(d, t)(o, a, -1.7f, n);
  }, kExact);
  check_elementwise("axpy", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t*, int64_t n) {
    R().axpy.at(d, t)(o, a, 0.3f, n);
  }, kLoose);
  check_elementwise("mul_acc", [](Device d, DType t, void* o, const void* a, const void* b, const uint8_t*,
                                  int64_t n) { R().mul_acc.at(d, t)(o, a, b, n); }, kLoose);
  // in place: out == a
  check_elementwise("add in place", [](Device d, DType t, void* o, const void*, const void* b, const uint8_t*,
                                       int64_t n) { R().add.at(d, t)(o, o, b, n); }, kExact);
}

TEST(CudaBasicKernels, Activations) {
  PT_REQUIRE_GPU();
  check_elementwise("relu_forward", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t*,
                                       int64_t n) { R().relu_forward.at(d, t)(o, a, n); }, kExact);
  check_elementwise("relu_backward", [](Device d, DType t, void* o, const void* a, const void* b, const uint8_t*,
                                        int64_t n) { R().relu_backward.at(d, t)(o, a, b, n); }, kExact);
  check_elementwise("gelu_forward", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t*,
                                       int64_t n) { R().gelu_forward.at(d, t)(o, a, n); }, kLoose);
  check_elementwise("gelu_backward", [](Device d, DType t, void* o, const void* a, const void* b, const uint8_t*,
                                        int64_t n) { R().gelu_backward.at(d, t)(o, a, b, n); }, kLoose);
  check_elementwise("tanh_forward", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t*,
                                       int64_t n) { R().tanh_forward.at(d, t)(o, a, n); }, kLoose);
  check_elementwise("tanh_backward", [](Device d, DType t, void* o, const void* a, const void* b, const uint8_t*,
                                        int64_t n) { R().tanh_backward.at(d, t)(o, a, b, n); }, kLoose);
  check_elementwise("sigmoid_forward", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t*,
                                          int64_t n) { R().sigmoid_forward.at(d, t)(o, a, n); }, kLoose);
  check_elementwise("sigmoid_backward", [](Device d, DType t, void* o, const void* a, const void* b,
                                           const uint8_t*, int64_t n) { R().sigmoid_backward.at(d, t)(o, a, b, n); },
                    kLoose);
  check_elementwise("dropout_forward", [](Device d, DType t, void* o, const void* a, const void*, const uint8_t* m,
                                          int64_t n) { R().dropout_forward.at(d, t)(o, a, m, 1.0f / 0.9f, n); },
                    kExact);
  check_elementwise("dropout_backward", [](Device d, DType t, void* o, const void* a, const void*,
                                           const uint8_t* m, int64_t n) {
    R().dropout_backward.at(d, t)(o, a, m, 1.0f / 0.9f, n);
  }, kLoose);
}

TEST(CudaBasicKernels, Bias) {
  PT_REQUIRE_GPU();
  const int64_t shapes[][2] = {{1, 1}, {37, 1000}, {1000, 37}, {4096, 768}, {3, 0}, {0, 5}};
  for (DType t : kFloatTypes) {
    for (auto& s : shapes) {
      const int64_t N = s[0], C = s[1];
      const std::string tag = " N=" + std::to_string(N) + " C=" + std::to_string(C);
      const Bytes out0 = random_array(t, N * C, 11), bias0 = random_array(t, C, 12);
      {  // bias_add
        Bytes want = out0;
        R().bias_add.at(kCpu, t)(want.data(), bias0.data(), N, C);
        DevBuf d_out(out0), d_bias(bias0);
        R().bias_add.at(kGpu, t)(d_out.p, d_bias.p, N, C);
        expect_close(t, d_out.get<uint8_t>(), want, half_ulp(t, kExact), "bias_add" + tag);
      }
      {  // bias_backward: dbias += column sums of dout
        Bytes want = bias0;
        R().bias_backward.at(kCpu, t)(want.data(), out0.data(), N, C);
        DevBuf d_dbias(bias0), d_dout(out0);
        R().bias_backward.at(kGpu, t)(d_dbias.p, d_dout.p, N, C);
        // the f32 column sums may differ by rounding: 1e-6 * N * max|dout| (about 40x the typical difference)
        double max_abs = 0;
        for (int64_t i = 0; i < N * C; ++i) max_abs = std::max(max_abs, std::fabs(double(decode(t, out0, i))));
        Tol tol = half_ulp(t, kExact);
        tol.abs += 1e-6 * max_abs * static_cast<double>(N) + 1e-6;
        expect_close(t, d_dbias.get<uint8_t>(), want, tol, "bias_backward" + tag);
      }
    }
  }
}

TEST(CudaBasicKernels, StridedAdd) {
  PT_REQUIRE_GPU();
  struct Case {
    std::vector<int64_t> sizes, strides;
    int64_t offset;  // of the view's first element in a 480-element buffer
  };
  const Case cases[] = {
      {{5, 10, 3}, {80, 1, 20}, 0},   // a permuted slice
      {{4, 6}, {-10, 1}, 30},         // a negative stride
      {{3, 4}, {4, 1}, 7},            // contiguous (merged)
      {{2, 1, 3, 1}, {100, 5, 2, 9}, 1},  // size-1 dims
      {{}, {}, 17},                   // a scalar
      {{3, 0}, {10, 1}, 0},           // empty
  };
  for (DType t : kFloatTypes) {
    for (const Case& c : cases) {
      int64_t count = 1;
      for (int64_t s : c.sizes) count *= s;
      const Bytes out0 = random_array(t, 480, 21), inp = random_array(t, count, 22);
      const size_t es = dtype_size(t);
      const int nd = static_cast<int>(c.sizes.size());
      Bytes want = out0;
      R().strided_add.at(kCpu, t)(want.data() + c.offset * es, inp.data(), nd, c.sizes.data(), c.strides.data());
      DevBuf d_out(out0), d_inp(inp);
      R().strided_add.at(kGpu, t)(static_cast<uint8_t*>(d_out.p) + c.offset * es, d_inp.p, nd, c.sizes.data(),
                                  c.strides.data());
      expect_close(t, d_out.get<uint8_t>(), want, half_ulp(t, kExact), "strided_add ndim=" + std::to_string(nd));
    }
  }
  const int64_t sizes[] = {2, 3}, strides[] = {0, 1};
  DevBuf d_out(size_t{64}), d_inp(size_t{64});
  EXPECT_THROW(R().strided_add.at(kGpu, DType::F32)(d_out.p, d_inp.p, 2, sizes, strides), InputError);
}

// ---- casts ----
TEST(CudaBasicKernels, CastsFromF32BitExact) {
  PT_REQUIRE_GPU();
  std::vector<float> in;
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(), 1e-40f, -1e-45f, 3.0e38f, -3.0e38f,
                            65504.0f, 65520.0f, 70000.0f, 6e-8f, 3e-8f, 1e-5f, 6.1e-5f};
  for (float f : specials) in.push_back(f);
  std::mt19937 rng(31);
  for (int i = 0; i < 200000; ++i) {  // random bit patterns (every exponent), ties for bf16 rounding
    uint32_t u = rng();
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;
    float f;
    std::memcpy(&f, &u, 4);
    in.push_back(f);
  }
  for (int i = 0; i < 100000; ++i) in.push_back(std::ldexp(static_cast<float>(rng() % 4096) / 4096.0f, -(int(rng() % 30))));
  const int64_t n = static_cast<int64_t>(in.size());
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> want(in.size());
    R().cast_from_f32.at(kCpu, t)(want.data(), in.data(), n);
    DevBuf d_in(in), d_out(in.size() * 2);
    R().cast_from_f32.at(kGpu, t)(d_out.p, d_in.p, n);
    const auto got = d_out.get<uint16_t>();
    const uint16_t exp_mask = t == DType::BF16 ? 0x7f80 : 0x7c00, mant_mask = t == DType::BF16 ? 0x7f : 0x3ff;
    int bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const bool nan_w = (want[i] & exp_mask) == exp_mask && (want[i] & mant_mask);
      const bool nan_g = (got[i] & exp_mask) == exp_mask && (got[i] & mant_mask);
      // f16 NaN payloads may differ between the CPU's implementations (half_util.h); NaN must stay NaN.
      const bool ok = t == DType::F16 && nan_w ? nan_g : got[i] == want[i];
      if (!ok && bad++ < 5)
        ADD_FAILURE() << dtype_name(t) << " from f32 " << in[i] << ": cuda 0x" << std::hex << got[i] << " cpu 0x"
                      << want[i] << std::dec;
    }
    EXPECT_EQ(bad, 0) << dtype_name(t);
  }
}

TEST(CudaBasicKernels, CastsToF32AllBitPatterns) {
  PT_REQUIRE_GPU();
  std::vector<uint16_t> in(65536);
  for (int i = 0; i < 65536; ++i) in[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<float> want(in.size());
    R().cast_to_f32.at(kCpu, t)(want.data(), in.data(), 65536);
    DevBuf d_in(in), d_out(in.size() * 4);
    R().cast_to_f32.at(kGpu, t)(d_out.p, d_in.p, 65536);
    const auto got = d_out.get<uint32_t>();
    int bad = 0;
    for (int i = 0; i < 65536; ++i) {
      uint32_t w;
      std::memcpy(&w, &want[i], 4);
      const bool ok = std::isnan(want[i]) ? (got[i] & 0x7fffffffu) > 0x7f800000u : got[i] == w;
      if (!ok && bad++ < 5)
        ADD_FAILURE() << dtype_name(t) << " 0x" << std::hex << i << " to f32: cuda 0x" << got[i] << " cpu 0x" << w
                      << std::dec;
    }
    EXPECT_EQ(bad, 0) << dtype_name(t);
  }
  // f32 "casts" are copies
  const std::vector<float> x = {1.5f, -2.25f, 3.0f};
  DevBuf d_x(x), d_y(x.size() * 4);
  R().cast_from_f32.at(kGpu, DType::F32)(d_y.p, d_x.p, 3);
  EXPECT_EQ(d_y.get<float>(), x);
}

// ---- reductions ----
TEST(CudaBasicKernels, Reductions) {
  PT_REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{1000003}, int64_t{(1 << 24) + 5}}) {
      const Bytes x = random_array(t, n, 41, -1.0f, 1.5f);
      DevBuf d_x(x);
      const double s_cpu = R().sum.at(kCpu, t)(x.data(), n), s_gpu = R().sum.at(kGpu, t)(d_x.p, n);
      EXPECT_NEAR(s_gpu, s_cpu, 1e-6 * std::fabs(s_cpu) + 1e-9) << "sum " << dtype_name(t) << " n=" << n;
      const double q_cpu = R().sum_squares.at(kCpu, t)(x.data(), n), q_gpu = R().sum_squares.at(kGpu, t)(d_x.p, n);
      EXPECT_NEAR(q_gpu, q_cpu, 1e-6 * std::fabs(q_cpu) + 1e-9) << "sum_squares " << dtype_name(t) << " n=" << n;
      EXPECT_TRUE(R().all_finite.at(kGpu, t)(d_x.p, n)) << dtype_name(t) << " n=" << n;
    }
    for (int64_t n : {int64_t{1}, int64_t{1000003}}) {
      for (int which : {0, 1, 2}) {  // +inf at the end, NaN at the start, -inf in the middle
        Bytes x = random_array(t, n, 42);
        const int64_t pos = which == 0 ? n - 1 : which == 1 ? 0 : n / 2;
        const float bad = which == 1 ? std::numeric_limits<float>::quiet_NaN()
                                     : (which == 0 ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity();
        if (t == DType::F32) {
          std::memcpy(x.data() + 4 * pos, &bad, 4);
        } else {
          const uint16_t h = t == DType::BF16 ? f32_to_bf16(bad) : f32_to_f16(bad);
          std::memcpy(x.data() + 2 * pos, &h, 2);
        }
        DevBuf d_x(x);
        EXPECT_FALSE(R().all_finite.at(kCpu, t)(x.data(), n));
        EXPECT_FALSE(R().all_finite.at(kGpu, t)(d_x.p, n)) << dtype_name(t) << " n=" << n << " bad at " << pos;
      }
    }
  }
}

// ---- GEMM ----
struct GemmShape {
  bool ta, tb;
  int64_t M, N, K, pad;  // pad: extra elements per row of A, B and C
};

// Runs gemm (batch == 0) or gemm_batched on CPU and CUDA and compares C.
void check_gemm(DType t, const GemmShape& s, float alpha, float beta, int64_t batch, int64_t sa_extra,
                int64_t sb_extra, bool share_a, bool share_b, const Registry& reg) {
  const int64_t ra = s.ta ? s.K : s.M, ca = s.ta ? s.M : s.K, rb = s.tb ? s.N : s.K, cb = s.tb ? s.K : s.N;
  const int64_t lda = std::max<int64_t>(1, ca + s.pad), ldb = std::max<int64_t>(1, cb + s.pad);
  const int64_t ldc = std::max<int64_t>(1, s.N + s.pad);
  const int64_t nb = std::max<int64_t>(batch, 1);
  const int64_t stride_a = share_a ? 0 : ra * lda + sa_extra, stride_b = share_b ? 0 : rb * ldb + sb_extra;
  const int64_t stride_c = s.M * ldc + 3;
  const Bytes A = random_array(t, stride_a * (nb - 1) + ra * lda, 51, -1, 1);
  const Bytes B = random_array(t, stride_b * (nb - 1) + rb * ldb, 52, -1, 1);
  Bytes C0 = random_array(t, stride_c * (nb - 1) + s.M * ldc, 53, -1, 1);
  if (beta == 0.0f) {  // beta == 0 must ignore C, NaN included
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i < C0.size() / dtype_size(t); i += 7) {
      if (t == DType::F32) {
        std::memcpy(C0.data() + 4 * i, &nan, 4);
      } else {
        const uint16_t h = t == DType::BF16 ? f32_to_bf16(nan) : f32_to_f16(nan);
        std::memcpy(C0.data() + 2 * i, &h, 2);
      }
    }
  }
  Bytes want = C0;
  DevBuf dA(A), dB(B), dC(C0);
  if (batch == 0) {
    reg.gemm.at(kCpu, t)(s.ta, s.tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
    reg.gemm.at(kGpu, t)(s.ta, s.tb, s.M, s.N, s.K, alpha, dA.p, lda, dB.p, ldb, beta, dC.p, ldc);
  } else {
    reg.gemm_batched.at(kCpu, t)(s.ta, s.tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, want.data(),
                                 ldc, batch, stride_a, stride_b, stride_c);
    reg.gemm_batched.at(kGpu, t)(s.ta, s.tb, s.M, s.N, s.K, alpha, dA.p, lda, dB.p, ldb, beta, dC.p, ldc, batch,
                                 stride_a, stride_b, stride_c);
  }
  const Tol tol = t == DType::F32 ? Tol{1e-4, 1e-4} : Tol{1e-2, 1e-2};
  expect_close(t, dC.get<uint8_t>(), want, tol,
               "gemm ta=" + std::to_string(s.ta) + " tb=" + std::to_string(s.tb) + " M=" + std::to_string(s.M) +
                   " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " pad=" + std::to_string(s.pad) +
                   " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
                   " batch=" + std::to_string(batch));
}

TEST(CudaBasicKernels, Gemm) {
  PT_REQUIRE_GPU();
  const int64_t dims[][3] = {{1, 1, 1}, {17, 33, 65}, {64, 48, 512}, {130, 7, 300}, {5, 200, 3}, {9, 11, 0}};
  for (DType t : kFloatTypes)
    for (auto& d : dims)
      for (int tr = 0; tr < 4; ++tr)
        for (int64_t pad : {0, 3})
          for (float beta : {0.0f, 0.5f})
            check_gemm(t, {bool(tr & 1), bool(tr & 2), d[0], d[1], d[2], pad}, 1.5f, beta, 0, 0, 0, false, false, R());
  // a second call of the same shape reuses the cached plan
  check_gemm(DType::F32, {false, true, 17, 33, 65, 0}, 1.0f, 1.0f, 0, 0, 0, false, false, R());
}

TEST(CudaBasicKernels, GemmBatched) {
  PT_REQUIRE_GPU();
  for (DType t : kFloatTypes)
    for (int tr = 0; tr < 4; ++tr)
      for (float beta : {0.0f, 1.0f}) {
        const GemmShape s{bool(tr & 1), bool(tr & 2), 19, 23, 37, 1};
        check_gemm(t, s, 0.75f, beta, 3, 5, 0, false, false, R());  // strided
        check_gemm(t, s, 0.75f, beta, 4, 0, 0, false, true, R());   // B shared (stride 0)
        check_gemm(t, s, 0.75f, beta, 2, 0, 0, true, false, R());   // A shared
        check_gemm(t, s, 0.75f, beta, 1, 0, 0, false, false, R());
      }
  check_gemm(DType::F32, {false, false, 8, 8, 0, 0}, 1.0f, 0.5f, 3, 0, 0, false, false, R());  // K == 0
}

// gemm_batched_to_f32 (bf16 A and B, f32 C: the GEMM attention's tensor-core form) against
// the CPU's gemm_batched_bf16: every layout, strided and shared operands, beta 0 (C ignored,
// NaN included) and 1, K == 0. The products of bf16 values are exact in f32: only the
// summation order differs, so the f32 tolerance holds.
TEST(CudaBasicKernels, GemmBatchedToF32) {
  PT_REQUIRE_GPU();
  const auto& cpu = R().gemm_batched_to_f32.at(kCpu, DType::BF16);
  const auto& gpu = R().gemm_batched_to_f32.at(kGpu, DType::BF16);
  for (int tr = 0; tr < 4; ++tr)
    for (float beta : {0.0f, 1.0f})
      for (int64_t K : {37, 0})
        for (int share = 0; share < 3; ++share) {
          const bool ta = tr & 1, tb = tr & 2;
          const int64_t M = 19, N = 23, batch = 3, lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 1, ldc = N + 2;
          const int64_t ra = ta ? K : M, rb = tb ? N : K;
          const int64_t sa = share == 1 ? 0 : ra * lda + 5, sb = share == 2 ? 0 : rb * ldb, sc = M * ldc + 3;
          const Bytes A = random_array(DType::BF16, std::max<int64_t>(1, sa * (batch - 1) + ra * lda), 61, -1, 1);
          const Bytes B = random_array(DType::BF16, std::max<int64_t>(1, sb * (batch - 1) + rb * ldb), 62, -1, 1);
          Bytes C0 = random_array(DType::F32, sc * (batch - 1) + M * ldc, 63, -1, 1);
          if (beta == 0.0f) {
            const float nan = std::numeric_limits<float>::quiet_NaN();
            for (size_t i = 0; i < C0.size() / 4; i += 7) std::memcpy(C0.data() + 4 * i, &nan, 4);
          }
          Bytes want = C0;
          DevBuf dA(A), dB(B), dC(C0);
          cpu(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, beta, want.data(), ldc, batch, sa, sb, sc);
          gpu(ta, tb, M, N, K, 0.5f, dA.p, lda, dB.p, ldb, beta, dC.p, ldc, batch, sa, sb, sc);
          expect_close(DType::F32, dC.get<uint8_t>(), want, Tol{1e-5, 1e-5},
                       "gemm_batched_to_f32 ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                           " K=" + std::to_string(K) + " beta=" + std::to_string(beta) +
                           " share=" + std::to_string(share));
        }
}

// gemm_bias (cuBLASLt's bias epilogue) against the CPU's gemm + bias_add: both layouts of
// the weight, shapes that do and do not fill tiles, K == 0 (out = bias), and a bias that is
// not 16-byte aligned (the unfused path). bf16/f16 round once where the CPU rounds twice:
// within the half GEMM tolerance.
TEST(CudaBasicKernels, GemmBias) {
  PT_REQUIRE_GPU();
  const int64_t dims[][3] = {{1, 1, 1}, {17, 33, 65}, {64, 48, 512}, {130, 7, 300}, {9, 11, 0}};
  for (DType t : kFloatTypes)
    for (auto& d : dims)
      for (bool tb : {false, true})
        for (int64_t bias_offset : {0, 1}) {
          const int64_t M = d[0], N = d[1], K = d[2], es = static_cast<int64_t>(dtype_size(t));
          const Bytes A = random_array(t, std::max<int64_t>(M * K, 1), 61, -1, 1);
          const Bytes B = random_array(t, std::max<int64_t>(K * N, 1), 62, -1, 1);
          const Bytes bias = random_array(t, N + 1, 63, -1, 1);
          Bytes want(static_cast<size_t>(M * N * es));
          const uint8_t* b_host = bias.data() + bias_offset * es;
          R().gemm_bias.at(kCpu, t)(tb, M, N, K, A.data(), B.data(), b_host, want.data());
          DevBuf dA(A), dB(B), dbias(bias), dout(want.size());
          R().gemm_bias.at(kGpu, t)(tb, M, N, K, dA.p, dB.p, static_cast<const uint8_t*>(dbias.p) + bias_offset * es,
                                    dout.p);
          const Tol tol = t == DType::F32 ? Tol{1e-4, 1e-4} : Tol{1e-2, 1e-2};
          expect_close(t, dout.get<uint8_t>(), want, tol,
                       "gemm_bias tb=" + std::to_string(tb) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + " bias offset " + std::to_string(bias_offset));
        }
}

// gemm_bias_gelu (cuBLASLt's GELU_AUX_BIAS epilogue) against the CPU's gemm_bias + gelu_forward:
// pre and out, both layouts, N a multiple of 8 (the epilogue) and not (the unfused kernels),
// K == 0 (pre = bias), and a bias or a pre that is not 16-byte aligned (unfused). The epilogue
// computes gelu from the f32 accumulator where the CPU computes it from the rounded pre, and
// its GELU is cuBLASLt's: within the GELU kernels' tolerance in f32, one half ulp more in the
// half types.
TEST(CudaBasicKernels, GemmBiasGelu) {
  PT_REQUIRE_GPU();
  const int64_t dims[][3] = {{1, 8, 1}, {17, 40, 65}, {64, 48, 512}, {256, 3072, 768}, {130, 7, 300}, {9, 16, 0}};
  for (DType t : kFloatTypes)
    for (auto& d : dims)
      for (bool tb : {false, true})
        for (int misaligned = 0; misaligned < 3; ++misaligned) {  // none, the bias, pre
          const int64_t M = d[0], N = d[1], K = d[2], es = static_cast<int64_t>(dtype_size(t));
          const Bytes A = random_array(t, std::max<int64_t>(M * K, 1), 71, -1, 1);
          const Bytes B = random_array(t, std::max<int64_t>(K * N, 1), 72, -1, 1);
          const Bytes bias = random_array(t, N + 1, 73, -1, 1);
          const size_t bytes = static_cast<size_t>(M * N * es);
          Bytes want_pre(bytes), want_out(bytes);
          const int64_t bias_offset = misaligned == 1, pre_offset = misaligned == 2;
          R().gemm_bias_gelu.at(kCpu, t)(tb, M, N, K, A.data(), B.data(), bias.data() + bias_offset * es,
                                         want_pre.data(), want_out.data());
          DevBuf dA(A), dB(B), dbias(bias), dpre(bytes + 16), dout(bytes);
          uint8_t* pre = static_cast<uint8_t*>(dpre.p) + pre_offset * es;
          R().gemm_bias_gelu.at(kGpu, t)(tb, M, N, K, dA.p, dB.p, static_cast<const uint8_t*>(dbias.p) + bias_offset * es,
                                         pre, dout.p);
          Bytes got_pre(bytes);
          PT_CUDA_CHECK(cudaDeviceSynchronize());  // the kernels ran on the compute stream
          PT_CUDA_CHECK(cudaMemcpy(got_pre.data(), pre, bytes, cudaMemcpyDeviceToHost));
          const Tol tol = t == DType::F32 ? Tol{1e-4, 1e-4} : Tol{1.5e-2, 1.5e-2};
          const std::string what = "gemm_bias_gelu tb=" + std::to_string(tb) + " M=" + std::to_string(M) +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K) + " misaligned " +
                                   std::to_string(misaligned);
          expect_close(t, got_pre, want_pre, tol, what + " pre");
          expect_close(t, dout.get<uint8_t>(), want_out, tol, what + " out");
        }
}

TEST(CudaBasicKernels, GemmThroughTheRegistry) {
  PT_REQUIRE_GPU();
  ASSERT_TRUE(registry().gemm.has(Device::CUDA, DType::F32));
  // C (2,2) = A (2,3) @ B (3,2), exact small integers
  const std::vector<float> A = {1, 2, 3, 4, 5, 6}, B = {1, 0, 0, 1, 1, 1};
  DevBuf dA(A), dB(B), dC(size_t{16});
  registry().gemm.at(Device::CUDA, DType::F32)(false, false, 2, 2, 3, 1.0f, dA.p, 3, dB.p, 2, 0.0f, dC.p, 2);
  EXPECT_EQ(dC.get<float>(), (std::vector<float>{4, 5, 10, 11}));
  // the f32-only tables have no half kernels on CUDA either
  EXPECT_FALSE(registry().embedding_forward.has(Device::CUDA, DType::BF16));
  EXPECT_FALSE(registry().adamw_update.has(Device::CUDA, DType::BF16));
  EXPECT_TRUE(registry().sum.has(Device::CUDA, DType::BF16));
}

// ---- embedding / encoder ----
std::vector<int32_t> random_tokens(int64_t n, int32_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  return t;
}
std::vector<float> as_f32(const Bytes& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), b.size());
  return f;
}
Bytes as_bytes(const std::vector<float>& f) {
  Bytes b(f.size() * 4);
  std::memcpy(b.data(), f.data(), b.size());
  return b;
}

TEST(CudaBasicKernels, Embedding) {
  PT_REQUIRE_GPU();
  const DType F = DType::F32;
  const int64_t N = 1000, V = 50, C = 77;
  const auto tokens = random_tokens(N, V, 61);
  const Bytes wte = random_array(F, V * C, 62), dout = random_array(F, N * C, 63), out0 = random_array(F, N * C, 64);
  DevBuf d_tok(tokens), d_wte(wte), d_dout(dout);
  {
    Bytes want = out0;
    R().embedding_forward.at(kCpu, F)(want.data(), tokens.data(), wte.data(), N, V, C);
    DevBuf d_out(out0);
    R().embedding_forward.at(kGpu, F)(d_out.p, static_cast<const int32_t*>(d_tok.p), d_wte.p, N, V, C);
    expect_close(F, d_out.get<uint8_t>(), want, kExact, "embedding_forward");
  }
  {
    Bytes want = wte;  // accumulate into a non-zero gradient
    R().embedding_backward.at(kCpu, F)(want.data(), dout.data(), tokens.data(), N, V, C);
    DevBuf d_dwte(wte);
    R().embedding_backward.at(kGpu, F)(d_dwte.p, d_dout.p, static_cast<const int32_t*>(d_tok.p), N, V, C);
    // Each row's positions added in position order, as the CPU adds them: its bits.
    expect_close(F, d_dwte.get<uint8_t>(), want, kExact, "embedding_backward");
  }
  {  // a bad id: recorded on the device, raised at the next wait; its row NaN, its gradient skipped
    auto bad = tokens;
    bad[123] = static_cast<int32_t>(V);
    DevBuf d_bad(bad), d_out(out0);
    R().embedding_forward.at(kGpu, F)(d_out.p, static_cast<const int32_t*>(d_bad.p), d_wte.p, N, V, C);
    const auto got = d_out.get<float>();
    for (int64_t c = 0; c < C; ++c) ASSERT_TRUE(std::isnan(got[123 * C + c])) << "column " << c;
    try {
      ::paratrain::cuda::synchronize();
      FAIL() << "the bad id was not raised";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("embedding_forward: token id 50 at position 123 is outside the vocabulary [0,50)"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
    }
    EXPECT_NO_THROW(::paratrain::cuda::synchronize()) << "raised once, then cleared";
    bad[123] = -1;
    Bytes want = wte;  // the CPU's gradient without position 123
    auto good = tokens;
    std::vector<float> dout_skip(N * C);
    std::memcpy(dout_skip.data(), dout.data(), dout.size());
    for (int64_t c = 0; c < C; ++c) dout_skip[123 * C + c] = 0.0f;
    R().embedding_backward.at(kCpu, F)(want.data(), dout_skip.data(), good.data(), N, V, C);
    DevBuf d_bad2(bad), d_dwte(wte);
    R().embedding_backward.at(kGpu, F)(d_dwte.p, d_dout.p, static_cast<const int32_t*>(d_bad2.p), N, V, C);
    expect_close(F, d_dwte.get<uint8_t>(), want, {0, 1e-4}, "embedding_backward skipping a bad id");
    EXPECT_THROW(::paratrain::cuda::synchronize(), InputError);
  }
}

TEST(CudaBasicKernels, DropoutMaskIsTheCpuTwinsBytes) {
  PT_REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{100003}, int64_t{1} << 20}) {
    std::vector<uint8_t> want(static_cast<size_t>(n));
    R().dropout_mask.at(kCpu, DType::U8)(want.data(), 0xDEADBEEFull + static_cast<uint64_t>(n), 0.1f, n);
    DevBuf d(static_cast<size_t>(n));
    R().dropout_mask.at(kGpu, DType::U8)(static_cast<uint8_t*>(d.p), 0xDEADBEEFull + static_cast<uint64_t>(n), 0.1f, n);
    ASSERT_EQ(d.get<uint8_t>(), want) << "n " << n;
  }
}

TEST(CudaBasicKernels, Encoder) {
  PT_REQUIRE_GPU();
  const DType F = DType::F32;
  const int64_t B = 4, T = 33, V = 50, C = 64, Tmax = 40;
  const auto tokens = random_tokens(B * T, V, 71);
  const Bytes wte = random_array(F, V * C, 72), wpe = random_array(F, Tmax * C, 73);
  const Bytes dout = random_array(F, B * T * C, 74), out0 = random_array(F, B * T * C, 75);
  DevBuf d_tok(tokens), d_wte(wte), d_wpe(wpe), d_dout(dout);
  const auto* tok = static_cast<const int32_t*>(d_tok.p);
  {
    Bytes want = out0;
    R().encoder_forward.at(kCpu, F)(want.data(), tokens.data(), wte.data(), wpe.data(), B, T, V, C);
    DevBuf d_out(out0);
    R().encoder_forward.at(kGpu, F)(d_out.p, tok, d_wte.p, d_wpe.p, B, T, V, C);
    expect_close(F, d_out.get<uint8_t>(), want, kExact, "encoder_forward");
  }
  for (int which = 0; which < 3; ++which) {  // both gradients, only dwte, only dwpe
    const bool with_wte = which != 2, with_wpe = which != 1;
    Bytes want_wte = wte, want_wpe = wpe;
    R().encoder_backward.at(kCpu, F)(with_wte ? want_wte.data() : nullptr, with_wpe ? want_wpe.data() : nullptr,
                                     dout.data(), tokens.data(), B, T, V, C);
    DevBuf g_wte(wte), g_wpe(wpe);
    R().encoder_backward.at(kGpu, F)(with_wte ? g_wte.p : nullptr, with_wpe ? g_wpe.p : nullptr, d_dout.p, tok, B, T,
                                     V, C);
    expect_close(F, g_wte.get<uint8_t>(), want_wte, {0, 1e-4}, "encoder_backward dwte");
    expect_close(F, g_wpe.get<uint8_t>(), want_wpe, kExact, "encoder_backward dwpe");
  }
}

// ---- optimizers ----
TEST(CudaBasicKernels, AdamW) {
  PT_REQUIRE_GPU();
  const DType F = DType::F32;
  for (int64_t n : kSizes) {
    for (int64_t step : {1, 7}) {
      const Bytes p0 = random_array(F, n, 81), g = random_array(F, n, 82), m0 = random_array(F, n, 83, -0.1f, 0.1f);
      const Bytes v0 = random_array(F, n, 84, 0.0f, 0.01f);
      Bytes p = p0, m = m0, v = v0;
      R().adamw_update.at(kCpu, F)(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, step);
      DevBuf dp(p0), dg(g), dm(m0), dv(v0);
      R().adamw_update.at(kGpu, F)(dp.p, dg.p, dm.p, dv.p, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, step);
      const std::string tag = " n=" + std::to_string(n) + " t=" + std::to_string(step);
      expect_close(F, dp.get<uint8_t>(), p, {1e-6, 1e-8}, "adamw p" + tag);
      expect_close(F, dm.get<uint8_t>(), m, {1e-6, 1e-8}, "adamw m" + tag);
      expect_close(F, dv.get<uint8_t>(), v, {1e-6, 1e-8}, "adamw v" + tag);
    }
  }
}

// 90 tensors (three launches of at most 40), sizes from 0 to 300k, each with its own weight
// decay: the GPU's multi-tensor update against the CPU's single-tensor kernel.
TEST(CudaBasicKernels, AdamWMultiTensor) {
  PT_REQUIRE_GPU();
  const DType F = DType::F32;
  std::vector<int64_t> sizes;
  for (int k = 0; k < 90; ++k) sizes.push_back(k % 9 == 0 ? 0 : k % 10 == 1 ? 300000 : 1 + (k * 997) % 5000);
  std::vector<Bytes> p, g, m, v;
  std::vector<std::unique_ptr<DevBuf>> dp, dg, dm, dv;
  std::vector<cpu::AdamWTensor> list;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const uint32_t seed = 500 + 4 * static_cast<uint32_t>(k);
    p.push_back(random_array(F, n, seed)), g.push_back(random_array(F, n, seed + 1));
    m.push_back(random_array(F, n, seed + 2, -0.1f, 0.1f)), v.push_back(random_array(F, n, seed + 3, 0.0f, 0.01f));
    dp.push_back(std::make_unique<DevBuf>(p[k])), dg.push_back(std::make_unique<DevBuf>(g[k]));
    dm.push_back(std::make_unique<DevBuf>(m[k])), dv.push_back(std::make_unique<DevBuf>(v[k]));
    const float wd = k % 3 == 0 ? 0.0f : 0.1f;
    list.push_back({static_cast<float*>(dp[k]->p), static_cast<const float*>(dg[k]->p), static_cast<float*>(dm[k]->p),
                    static_cast<float*>(dv[k]->p), n, wd});
    R().adamw_update.at(kCpu, F)(p[k].data(), g[k].data(), m[k].data(), v[k].data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                 wd, 5);
  }
  R().adamw_update_multi.at(kGpu, F)(list.data(), static_cast<int64_t>(list.size()), 1e-3f, 0.9f, 0.999f, 1e-8f, 5);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const std::string tag = " tensor " + std::to_string(k) + " n=" + std::to_string(sizes[k]);
    expect_close(F, dp[k]->get<uint8_t>(), p[k], {1e-6, 1e-8}, "adamw_multi p" + tag);
    expect_close(F, dm[k]->get<uint8_t>(), m[k], {1e-6, 1e-8}, "adamw_multi m" + tag);
    expect_close(F, dv[k]->get<uint8_t>(), v[k], {1e-6, 1e-8}, "adamw_multi v" + tag);
  }
}

TEST(CudaBasicKernels, Sgd) {
  PT_REQUIRE_GPU();
  const DType F = DType::F32;
  for (int64_t n : kSizes) {
    for (int variant = 0; variant < 5; ++variant) {
      // 0: no momentum (no buffer); 1/2: momentum first step / later; 3: nesterov; 4: no weight decay
      const float momentum = variant == 0 ? 0.0f : 0.9f, wd = variant == 4 ? 0.0f : 0.01f;
      const bool nesterov = variant == 3, first = variant == 1;
      const Bytes p0 = random_array(F, n, 91), g = random_array(F, n, 92), b0 = random_array(F, n, 93);
      Bytes p = p0, buf = b0;
      R().sgd_update.at(kCpu, F)(p.data(), g.data(), momentum != 0 ? buf.data() : nullptr, n, 0.05f, momentum, 0.1f,
                                 wd, nesterov, first);
      DevBuf dp(p0), dg(g), db(b0);
      R().sgd_update.at(kGpu, F)(dp.p, dg.p, momentum != 0 ? db.p : nullptr, n, 0.05f, momentum, 0.1f, wd, nesterov,
                                 first);
      const std::string tag = " n=" + std::to_string(n) + " variant=" + std::to_string(variant);
      // The CPU build fuses the multiply-adds into FMAs (GCC, -march=native) where the GPU
      // rounds each step: one rounding of operands of size ~1 apart, which cancellation
      // leaves in a small result, hence the absolute 1e-6.
      expect_close(F, dp.get<uint8_t>(), p, {1e-6, 1e-6}, "sgd p" + tag);
      expect_close(F, db.get<uint8_t>(), buf, {1e-6, 1e-6}, "sgd buf" + tag);
    }
  }
}

// PowerSGD's Gram-Schmidt: the CPU's orthonormal columns, with a zero column kept zero and a
// nearly dependent column (column 0 plus 1e-3 noise) orthogonalised by the second pass; sizes
// around the block's 512 threads and the tall P of a vocabulary-sized gradient. (The kernel, its
// block sums and barriers, also runs on the CPU: OrthogonalizeEmulated.* in tests/kernels.)
TEST(CudaBasicKernels, OrthogonalizeColumns) {
  PT_REQUIRE_GPU();
  const DType F = DType::F32;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{511}, int64_t{512}, int64_t{1000}, int64_t{50257}}) {
    for (int64_t r : {int64_t{1}, int64_t{4}, int64_t{5}}) {
      // More columns than rows cannot all be orthonormal: what is left of them is rounding
      // noise, normalised (PowerSGD never asks: its factors compress only when r < n).
      if (r > n) continue;
      Bytes P = random_array(F, n * r, static_cast<uint32_t>(7 * n + r));
      float* p = reinterpret_cast<float*>(P.data());
      if (r >= 4 && n >= 5) {
        const Bytes noise = random_array(F, n, 3);
        for (int64_t i = 0; i < n; ++i) {
          p[i * r + 2] = 0.0f;
          p[i * r + 3] = p[i * r] + 1e-3f * reinterpret_cast<const float*>(noise.data())[i];
        }
      }
      DevBuf dp(P);
      R().orthogonalize_columns.at(kCpu, F)(P.data(), n, r);
      R().orthogonalize_columns.at(kGpu, F)(dp.p, n, r);
      const std::string tag = " n=" + std::to_string(n) + " r=" + std::to_string(r);
      const Bytes got = dp.get<uint8_t>();
      expect_close(F, got, P, {1e-6, 1e-9}, "orthogonalize_columns" + tag);
      const float* g = reinterpret_cast<const float*>(got.data());
      for (int64_t a = 0; a < r; ++a)
        for (int64_t b = 0; b <= a; ++b) {
          double d = 0;
          for (int64_t i = 0; i < n; ++i) d += static_cast<double>(g[i * r + a]) * g[i * r + b];
          const bool zero = r >= 4 && n >= 5 && (a == 2 || b == 2);
          const double want = zero ? 0.0 : a == b ? 1.0 : 0.0;
          EXPECT_NEAR(d, want, 1e-5) << "column " << a << " . column " << b << tag;
        }
    }
  }
}

}  // namespace
}  // namespace paratrain::kernels
