#include <cmath>
#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/attention_by_gemm.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/kernels/registry.h"

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

namespace paratrain::kernels::cpu {
namespace {

// ---- attention by batched GEMMs (kernels/attention_by_gemm.h), the CUDA formulation, run
// here over the CPU's tables: the same reference, for chunks of 1, 7, 16 rows and the
// automatic size, so every chunk boundary (inside a row block, at T) is crossed. ----
void run_by_gemm(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t chunk_rows) {
  auto qkv = randn(B * T * 3 * C, 100 + T, 1.0f);
  auto dout = randn(B * T * C, 200 + T);
  std::vector<float> out(B * T * C, NAN), lse(B * NH * T, NAN), dqkv(B * T * 3 * C, 0.5f);
  attention_by_gemm_forward<Device::CPU, DType::F32>(out.data(), lse.data(), qkv.data(), B, T, C, NH, chunk_rows);
  attention_by_gemm_backward<Device::CPU, DType::F32>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                                      B, T, C, NH, chunk_rows);
  for (auto& v : dqkv) v -= 0.5f;  // the backward adds to dqkv
  Ref r = reference(qkv, dout, B, T, C, NH);
  EXPECT_TRUE(all_close(out, r.out, 1e-5, 1e-4)) << "out B=" << B << " T=" << T << " chunk " << chunk_rows;
  EXPECT_TRUE(all_close(lse, r.lse, 1e-5, 1e-5)) << "lse T=" << T << " chunk " << chunk_rows;
  EXPECT_TRUE(all_close(dqkv, r.dqkv, 1e-4, 1e-3)) << "dqkv B=" << B << " T=" << T << " chunk " << chunk_rows;
}

TEST(AttentionByGemm, MatchesNaiveReferenceInEveryChunking) {
  for (int64_t chunk : {1, 7, 16, 0}) {
    run_by_gemm(1, 1, 8, 2, chunk);
    run_by_gemm(2, 5, 12, 3, chunk);
    run_by_gemm(2, 65, 16, 1, chunk);
    run_by_gemm(2, 97, 24, 2, chunk);
  }
  run_by_gemm(1, 40, 320, 2, 16);  // head size 160: past the CUDA tile kernel's 128
}

// Without lse (inference) the forward still gives the output.
TEST(AttentionByGemm, ForwardWithoutLse) {
  const int64_t B = 2, T = 33, C = 16, NH = 2;
  auto qkv = randn(B * T * 3 * C, 5, 1.0f);
  std::vector<float> a(B * T * C), b(B * T * C);
  attention_forward(a.data(), nullptr, qkv.data(), B, T, C, NH);
  attention_by_gemm_forward<Device::CPU, DType::F32>(b.data(), nullptr, qkv.data(), B, T, C, NH, 8);
  std::vector<double> ad(a.begin(), a.end());
  EXPECT_TRUE(all_close(b, ad, 1e-6, 1e-5));
}

// bf16 or f16 in and out: q, k, v widened, f32 throughout, out and dqkv rounded once, as the
// fused half attention does; the two differ only in f32 summation order, so by at most an ulp
// of the half type here and there. (f16 is what the CUDA tables run for --precision fp16.)
TEST(AttentionByGemm, HalfFollowsTheFusedHalfAttention) {
  const int64_t B = 2, T = 37, C = 32, NH = 2;
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const bool bf = t == DType::BF16;
    auto to_half = [bf](float x) { return bf ? paratrain::f32_to_bf16(x) : paratrain::f32_to_f16(x); };
    auto to_float = [bf](uint16_t h) { return bf ? paratrain::bf16_to_f32(h) : paratrain::f16_to_f32(h); };
    auto qf = randn(B * T * 3 * C, 9, 1.0f), gf = randn(B * T * C, 10);
    std::vector<uint16_t> qkv(qf.size()), dout(gf.size());
    for (size_t i = 0; i < qf.size(); ++i) qkv[i] = to_half(qf[i]);
    for (size_t i = 0; i < gf.size(); ++i) dout[i] = to_half(gf[i]);
    const auto& fwd = registry().attention_forward.at(Device::CPU, t);
    const auto& bwd = registry().attention_backward.at(Device::CPU, t);
    std::vector<uint16_t> out_a(B * T * C), out_b(B * T * C), dqkv_a(qkv.size(), 0), dqkv_b(qkv.size(), 0);
    std::vector<float> lse_a(B * NH * T), lse_b(B * NH * T);
    fwd(out_a.data(), lse_a.data(), qkv.data(), B, T, C, NH);
    bwd(dqkv_a.data(), dout.data(), qkv.data(), out_a.data(), lse_a.data(), B, T, C, NH);
    const auto by_gemm_fwd = bf ? &attention_by_gemm_forward<Device::CPU, DType::BF16>
                                : &attention_by_gemm_forward<Device::CPU, DType::F16>;
    const auto by_gemm_bwd = bf ? &attention_by_gemm_backward<Device::CPU, DType::BF16>
                                : &attention_by_gemm_backward<Device::CPU, DType::F16>;
    by_gemm_fwd(out_b.data(), lse_b.data(), qkv.data(), B, T, C, NH, 16, false);
    by_gemm_bwd(dqkv_b.data(), dout.data(), qkv.data(), out_a.data(), lse_a.data(), B, T, C, NH, 16, false);
    auto widen = [&](const std::vector<uint16_t>& v) {
      std::vector<double> d(v.size());
      for (size_t i = 0; i < v.size(); ++i) d[i] = to_float(v[i]);
      return d;
    };
    auto as_float = [&](const std::vector<uint16_t>& v) {
      std::vector<float> f(v.size());
      for (size_t i = 0; i < v.size(); ++i) f[i] = to_float(v[i]);
      return f;
    };
    const double tol = bf ? 1e-2 : 2e-3;  // an ulp of the type: 2^-8 and 2^-11 relative
    EXPECT_TRUE(all_close(as_float(out_b), widen(out_a), tol, tol));
    EXPECT_TRUE(all_close(lse_b, std::vector<double>(lse_a.begin(), lse_a.end()), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(as_float(dqkv_b), widen(dqkv_a), 2 * tol, 2 * tol));
  }
}

// bf16 products (the GPU's tensor-core form): P and dS rounded to bf16 before their GEMMs.
// Against the fused bf16 attention: the output within the bf16 tolerance of the GPU tests
// (2e-2 relative plus 1e-3 of the largest value), the gradient within 2e-2 plus 4e-3 of the
// largest, and measurably different from the f32-products form (the rounding happens); T =
// 200 so that rows sum many rounded probabilities.
TEST(AttentionByGemm, Bf16ProductsStayWithinTheBf16Tolerance) {
  const int64_t B = 2, T = 200, C = 64, NH = 2;
  auto qf = randn(B * T * 3 * C, 19, 1.0f), gf = randn(B * T * C, 20);
  std::vector<uint16_t> qkv(qf.size()), dout(gf.size());
  for (size_t i = 0; i < qf.size(); ++i) qkv[i] = paratrain::f32_to_bf16(qf[i]);
  for (size_t i = 0; i < gf.size(); ++i) dout[i] = paratrain::f32_to_bf16(gf[i]);
  auto as_float = [](const std::vector<uint16_t>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = paratrain::bf16_to_f32(v[i]);
    return f;
  };
  auto max_abs = [](const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
  };
  std::vector<uint16_t> out_ref(B * T * C), dqkv_ref(qkv.size(), 0);
  std::vector<float> lse_ref(B * NH * T);
  registry().attention_forward.at(Device::CPU, DType::BF16)(out_ref.data(), lse_ref.data(), qkv.data(), B, T, C, NH);
  registry().attention_backward.at(Device::CPU, DType::BF16)(dqkv_ref.data(), dout.data(), qkv.data(), out_ref.data(),
                                                            lse_ref.data(), B, T, C, NH);
  std::vector<std::vector<float>> outs, grads;
  for (bool half : {false, true}) {
    std::vector<uint16_t> out(B * T * C), dqkv(qkv.size(), 0);
    std::vector<float> lse(B * NH * T);
    attention_by_gemm_forward<Device::CPU, DType::BF16>(out.data(), lse.data(), qkv.data(), B, T, C, NH, 48, half);
    attention_by_gemm_backward<Device::CPU, DType::BF16>(dqkv.data(), dout.data(), qkv.data(), out_ref.data(),
                                                         lse_ref.data(), B, T, C, NH, 48, half);
    const auto o = as_float(out), g = as_float(dqkv), o_ref = as_float(out_ref), g_ref = as_float(dqkv_ref);
    EXPECT_TRUE(all_close(o, std::vector<double>(o_ref.begin(), o_ref.end()), 1e-3 * max_abs(o_ref), 2e-2)) << half;
    // The gradient's small elements carry the rounding of many bf16 P and dS terms: about
    // 1.2e-3 of the largest here with bf16 products, none without.
    EXPECT_TRUE(all_close(g, std::vector<double>(g_ref.begin(), g_ref.end()), (half ? 4e-3 : 1e-3) * max_abs(g_ref),
                          2e-2))
        << half;
    EXPECT_TRUE(all_close(lse, std::vector<double>(lse_ref.begin(), lse_ref.end()), 1e-5, 1e-5)) << half;
    outs.push_back(o), grads.push_back(g);
  }
  EXPECT_NE(outs[0], outs[1]) << "rounding P to bf16 changed no output: the bf16-products path did not run";
  EXPECT_NE(grads[0], grads[1]);
}

// A chunk is at most 128 query rows (whole tiles of 16) and its scores at most 128 MiB.
TEST(AttentionByGemm, ChunksBoundTheScores) {
  EXPECT_EQ(attention_chunk_rows(1, 64, 2), 64);      // small: one chunk
  EXPECT_EQ(attention_chunk_rows(8, 1024, 12), 128);  // gpt2-124m, micro-batch 8: 48 MiB of scores
  const int64_t R = attention_chunk_rows(32, 4096, 16);
  EXPECT_EQ(R % 16, 0);
  EXPECT_LE(R * 32 * 16 * 4096 * 4, int64_t{128} << 20);
  EXPECT_GT(R * 32 * 16 * 4096 * 4, int64_t{64} << 20);
  EXPECT_GE(attention_chunk_rows(64, 32768, 64), 1);  // never 0, however large
}

}  // namespace
}  // namespace paratrain::kernels::cpu
