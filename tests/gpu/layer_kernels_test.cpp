// The CUDA layer kernels (src/kernels/cuda: LayerNorm, softmax, log-softmax, cross-entropy,
// causal attention) against the CPU kernels, through the dispatch tables for Device::CUDA.
// Inputs are random with fixed seeds; the backward kernels get gradient buffers prefilled
// with non-zero values, so their += is checked (and crossentropy_backward's =).
//
// Tolerances, per element, with M = max |want| over the tensor:
//   f32:  |got - want| <= 1e-5 |want| + 1e-5 M
//   bf16: |got - want| <= 2e-2 |want| + 1e-3 M   (bf16 outputs of both kernels, rounded once
//         from f32 sums of identical bf16 inputs: they differ by the f32 summation order and
//         at most a rounding flip, 2^-8 relative)
// For an accumulating f32 gradient the increments got - base and want - base are compared
// (M their largest magnitude), with 4 ulps of |base| more for the rounding of the adds.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "support/expect_values.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "kernels/cuda/flash_launch.h"
#include "kernels/cuda/layers.h"
#include "paratrain/kernels/attention_by_gemm.h"
#include "paratrain/kernels/cpu/attention.h"
#include "paratrain/kernels/cpu/attention_parts.h"
#include "paratrain/kernels/cpu/elementwise.h"
#include "paratrain/kernels/cpu/layernorm.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/cuda_check.h"
#include "support/error_of.h"

namespace paratrain::kernels {
namespace {

constexpr Device kGpu = Device::CUDA;
constexpr Device kCpu = Device::CPU;
constexpr DType kF32 = DType::F32;
constexpr DType kBF16 = DType::BF16;

using test::expect_close;
using test::Tolerance;
constexpr Tolerance kF32Tol{1e-5, 1e-5};
constexpr Tolerance kBF16Tol{2e-2, 1e-3};
// f16 keeps 11 significant bits: a few of its ulps (4e-3) plus 1e-3 of the largest value.
constexpr Tolerance kF16Tol{4e-3, 1e-3};

// A device copy of a host vector; download() waits for the device and copies back.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    PT_CUDA_CHECK(cudaMalloc(&p_, bytes()));
    PT_CUDA_CHECK(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice));
    PT_CUDA_CHECK(cudaDeviceSynchronize());  // the copy is done before a kernel on another stream reads it
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> download() const {
    PT_CUDA_CHECK(cudaDeviceSynchronize());  // every stream's kernels are done
    std::vector<T> h(n_);
    PT_CUDA_CHECK(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  size_t bytes() const { return std::max<size_t>(1, n_) * sizeof(T); }
  size_t n_;
  T* p_ = nullptr;
};

template <typename T>
std::vector<T> filled(size_t n, T value) {
  return std::vector<T>(n, value);
}

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  cpu::f32_to_bf16(b.data(), f.data(), static_cast<int64_t>(f.size()));
  return b;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  cpu::bf16_to_f32(f.data(), b.data(), static_cast<int64_t>(b.size()));
  return f;
}

// Values in (and out of) a half type, bf16 or f16.
std::vector<uint16_t> to_half(DType t, const std::vector<float>& f) {
  if (t == kBF16) return to_bf16(f);
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) h[i] = f32_to_f16(f[i]);
  return h;
}
std::vector<float> from_half(DType t, const std::vector<uint16_t>& h) {
  if (t == kBF16) return from_bf16(h);
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = f16_to_f32(h[i]);
  return f;
}


void expect_close_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, const char* what) {
  expect_close(from_bf16(got), from_bf16(want), kBF16Tol, what);
}

const Registry& R() { return registry(); }

// ---- registration (no GPU needed) ----

// No GPU needed (tests/gpu is only built with CUDA).
TEST(CudaLayerKernels, RegisteredWithTheCpuDtypes) {
  const Registry& r = R();
  // f32 for every layer kernel; bf16 exactly where the CPU has it.
  auto same_dtypes = [](const auto& t) {
    EXPECT_TRUE(t.has(kGpu, kF32)) << t.op();
    EXPECT_EQ(t.has(kGpu, kBF16), t.has(kCpu, kBF16)) << t.op();
  };
  same_dtypes(r.layernorm_forward);
  same_dtypes(r.layernorm_backward);
  same_dtypes(r.softmax_forward);
  same_dtypes(r.softmax_backward);
  same_dtypes(r.log_softmax_forward);
  same_dtypes(r.log_softmax_backward);
  same_dtypes(r.crossentropy_forward);
  same_dtypes(r.crossentropy_backward);
  same_dtypes(r.attention_forward);
  same_dtypes(r.attention_backward);
  EXPECT_TRUE(r.attention_forward.has(kGpu, kBF16));
  EXPECT_TRUE(r.crossentropy_backward.has(kGpu, kBF16));
  // --precision fp16 runs the attention and the loss in f16: the GPU has them as the CPU does.
  auto has_f16 = [](const auto& t) {
    EXPECT_TRUE(t.has(kCpu, DType::F16)) << t.op();
    EXPECT_TRUE(t.has(kGpu, DType::F16)) << t.op();
  };
  has_f16(r.attention_forward);
  has_f16(r.attention_backward);
  has_f16(r.crossentropy_forward);
  has_f16(r.crossentropy_backward);
  has_f16(r.attention_split_heads);
  has_f16(r.attention_merge_heads);
}

// ---- LayerNorm ----

TEST(CudaLayerKernels, LayerNormMatchesCpu) {
  PT_REQUIRE_GPU();
  struct Case {
    int64_t N, C;
    bool affine;
  };
  for (const Case& k : {Case{1, 7, true}, Case{37, 768, true}, Case{256, 100, false}, Case{5, 3000, true},
                        Case{1000, 64, true}}) {  // 1000 rows: four chunks of the parameter sums
    SCOPED_TRACE("N=" + std::to_string(k.N) + " C=" + std::to_string(k.C) + " affine=" + std::to_string(k.affine));
    const size_t n = static_cast<size_t>(k.N * k.C), c = static_cast<size_t>(k.C), rows = static_cast<size_t>(k.N);
    std::vector<float> x = uniform(n, -2, 2, 1);
    for (size_t i = 0; i < n; ++i) x[i] += static_cast<float>(i / c % 7);  // row offsets: the two passes matter
    const std::vector<float> w = uniform(c, 0.5f, 1.5f, 2), b = uniform(c, -0.5f, 0.5f, 3);
    const float* wp = k.affine ? w.data() : nullptr;
    const float* bp = k.affine ? b.data() : nullptr;

    std::vector<float> out(n), mean(rows), rstd(rows);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), wp, bp, k.N, k.C);
    DeviceBuffer<float> dx(x), dw(w), db(b), dout_(filled(n, 0.0f)), dmean(filled(rows, 0.0f)),
        drstd(filled(rows, 0.0f));
    R().layernorm_forward.at(kGpu, kF32)(dout_.get(), dmean.get(), drstd.get(), dx.get(),
                                         k.affine ? dw.get() : nullptr, k.affine ? db.get() : nullptr, k.N, k.C,
                                         cpu::kLayerNormEps);
    expect_close(dout_.download(), out, kF32Tol, "layernorm out");
    // A mean is a sum of C values over C: its rounding is of the inputs' size (C ulps of the
    // largest |x|), not of the mean's own, which cancellation makes small (N=1, C=7).
    const std::vector<float> got_mean = dmean.download();
    double xmax = 0;
    for (float v : x) xmax = std::max(xmax, std::fabs(static_cast<double>(v)));
    for (size_t r = 0; r < rows; ++r)
      EXPECT_NEAR(got_mean[r], mean[r], static_cast<double>(k.C) * std::ldexp(xmax, -23)) << "layernorm mean[" << r << "]";
    expect_close(drstd.download(), rstd, kF32Tol, "layernorm rstd");

    // Backward from the CPU's mean/rstd into prefilled gradients.
    const std::vector<float> g = uniform(n, -1, 1, 4);
    const std::vector<float> di0 = uniform(n, -0.1f, 0.1f, 5), dw0 = uniform(c, -0.1f, 0.1f, 6),
                             db0 = uniform(c, -0.1f, 0.1f, 7);
    std::vector<float> di = di0, dwt = dw0, dbs = db0;
    cpu::layernorm_backward(di.data(), dwt.data(), dbs.data(), g.data(), x.data(), wp, mean.data(), rstd.data(),
                            k.N, k.C);
    DeviceBuffer<float> dg(g), ddi(di0), ddw(dw0), ddb(db0), cmean(mean), crstd(rstd);
    R().layernorm_backward.at(kGpu, kF32)(ddi.get(), ddw.get(), ddb.get(), dg.get(), dx.get(),
                                          k.affine ? dw.get() : nullptr, cmean.get(), crstd.get(), k.N, k.C);
    expect_close(ddi.download(), di, kF32Tol, "layernorm dinp", &di0);
    expect_close(ddw.download(), dwt, kF32Tol, "layernorm dweight", &dw0);
    expect_close(ddb.download(), dbs, kF32Tol, "layernorm dbias", &db0);
    {  // chunk sums added in chunk order, no atomics: a second run gives the same bits
      DeviceBuffer<float> ddi3(di0), ddw3(dw0), ddb3(db0);
      R().layernorm_backward.at(kGpu, kF32)(ddi3.get(), ddw3.get(), ddb3.get(), dg.get(), dx.get(),
                                            k.affine ? dw.get() : nullptr, cmean.get(), crstd.get(), k.N, k.C);
      EXPECT_EQ(ddw3.download(), ddw.download()) << "layernorm dweight, run to run";
      EXPECT_EQ(ddb3.download(), ddb.download()) << "layernorm dbias, run to run";
    }

    // Gradients not wanted (nullptr) are skipped; dinp alone still accumulates.
    DeviceBuffer<float> ddi2(di0);
    R().layernorm_backward.at(kGpu, kF32)(ddi2.get(), nullptr, nullptr, dg.get(), dx.get(),
                                          k.affine ? dw.get() : nullptr, cmean.get(), crstd.get(), k.N, k.C);
    expect_close(ddi2.download(), di, kF32Tol, "layernorm dinp alone", &di0);
  }
}

// ---- softmax, log-softmax ----

TEST(CudaLayerKernels, SoftmaxAndLogSoftmaxMatchCpu) {
  PT_REQUIRE_GPU();
  struct Case {
    int64_t N, C;
  };
  for (const Case& k : {Case{1, 1}, Case{37, 1000}, Case{3, 50257}}) {
    SCOPED_TRACE("N=" + std::to_string(k.N) + " C=" + std::to_string(k.C));
    const size_t n = static_cast<size_t>(k.N * k.C);
    std::vector<float> x = uniform(n, -4, 4, 11);
    for (int64_t c = 0; c < k.C; ++c) x[c] += 100.0f;  // row 0 overflows exp without the max subtraction
    const std::vector<float> g = uniform(n, -1, 1, 12), d0 = uniform(n, -0.1f, 0.1f, 13);
    DeviceBuffer<float> dx(x), dg(g);

    std::vector<float> y(n), ly(n);
    cpu::softmax_forward(y.data(), x.data(), k.N, k.C);
    cpu::log_softmax_forward(ly.data(), x.data(), k.N, k.C);
    DeviceBuffer<float> dy(filled(n, 9.0f)), dly(filled(n, 9.0f));
    R().softmax_forward.at(kGpu, kF32)(dy.get(), dx.get(), k.N, k.C);
    R().log_softmax_forward.at(kGpu, kF32)(dly.get(), dx.get(), k.N, k.C);
    expect_close(dy.download(), y, kF32Tol, "softmax out");
    expect_close(dly.download(), ly, kF32Tol, "log_softmax out");

    std::vector<float> d = d0, ld = d0;
    cpu::softmax_backward(d.data(), g.data(), y.data(), k.N, k.C);
    cpu::log_softmax_backward(ld.data(), g.data(), ly.data(), k.N, k.C);
    DeviceBuffer<float> cy(y), cly(ly), dd(d0), dld(d0);
    R().softmax_backward.at(kGpu, kF32)(dd.get(), dg.get(), cy.get(), k.N, k.C);
    R().log_softmax_backward.at(kGpu, kF32)(dld.get(), dg.get(), cly.get(), k.N, k.C);
    expect_close(dd.download(), d, kF32Tol, "softmax dinp", &d0);
    expect_close(dld.download(), ld, kF32Tol, "log_softmax dinp", &d0);
  }
}

// ---- cross-entropy ----

struct CeCase {
  int64_t N, V;
};
constexpr CeCase kCeCases[] = {{1, 10}, {37, 50257}, {64, 1000}};

std::vector<int32_t> targets_for(CeCase k) {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(k.V - 1));
  std::vector<int32_t> t(static_cast<size_t>(k.N));
  for (auto& x : t) x = d(rng);
  for (size_t r : {size_t{3}, size_t{10}})
    if (r < t.size()) t[r] = cpu::kIgnoreIndex;
  return t;
}

TEST(CudaLayerKernels, CrossEntropyF32MatchesCpu) {
  PT_REQUIRE_GPU();
  for (const CeCase& k : kCeCases) {
    SCOPED_TRACE("N=" + std::to_string(k.N) + " V=" + std::to_string(k.V));
    const size_t n = static_cast<size_t>(k.N * k.V), rows = static_cast<size_t>(k.N);
    const std::vector<float> x = uniform(n, -3, 3, 22), dl = uniform(rows, 0.1f, 1.0f, 23);
    const std::vector<int32_t> t = targets_for(k);
    std::vector<float> loss(rows), lse(rows), dlogits(n);
    cpu::crossentropy_forward(loss.data(), lse.data(), x.data(), t.data(), k.N, k.V, k.V);
    cpu::crossentropy_backward(dlogits.data(), dl.data(), x.data(), lse.data(), t.data(), k.N, k.V, k.V);

    DeviceBuffer<float> dx(x), ddl(dl), dloss(filled(rows, 5.0f)), dlse(filled(rows, 0.0f));
    DeviceBuffer<int32_t> dt(t);
    R().crossentropy_forward.at(kGpu, kF32)(dloss.get(), dlse.get(), dx.get(), dt.get(), k.N, k.V, k.V);
    expect_close(dloss.download(), loss, kF32Tol, "crossentropy losses");
    expect_close(dlse.download(), lse, kF32Tol, "crossentropy lse");

    // Overwrites a prefilled dlogits; then in place over a copy of the logits.
    DeviceBuffer<float> cl(lse), dd(filled(n, 7.0f)), inplace(x);
    R().crossentropy_backward.at(kGpu, kF32)(dd.get(), ddl.get(), dx.get(), cl.get(), dt.get(), k.N, k.V, k.V);
    expect_close(dd.download(), dlogits, kF32Tol, "crossentropy dlogits");
    R().crossentropy_backward.at(kGpu, kF32)(inplace.get(), ddl.get(), inplace.get(), cl.get(), dt.get(), k.N, k.V, k.V);
    expect_close(inplace.download(), dlogits, kF32Tol, "crossentropy dlogits in place");
  }
}

// bf16 and f16 (--precision fp16) logits against the CPU's kernel of the same type: the f32
// statistics of identical inputs within the f32 tolerance, the gradient within its type's.
TEST(CudaLayerKernels, CrossEntropyHalfMatchesCpu) {
  PT_REQUIRE_GPU();
  for (DType type : {kBF16, DType::F16}) {
    const bool bf = type == kBF16;
    const Tolerance tol = bf ? kBF16Tol : kF16Tol;
    const uint16_t seven = bf ? 0x40e0 : 0x4700;  // 7.0: must be overwritten
    for (const CeCase& k : kCeCases) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " N=" + std::to_string(k.N) + " V=" + std::to_string(k.V));
      const size_t n = static_cast<size_t>(k.N * k.V), rows = static_cast<size_t>(k.N);
      const std::vector<uint16_t> x = to_half(type, uniform(n, -3, 3, 24));
      const std::vector<float> dl = uniform(rows, 0.1f, 1.0f, 25);
      const std::vector<int32_t> t = targets_for(k);
      std::vector<float> loss(rows), lse(rows);
      std::vector<uint16_t> dlogits(n);
      R().crossentropy_forward.at(kCpu, type)(loss.data(), lse.data(), x.data(), t.data(), k.N, k.V, k.V);
      R().crossentropy_backward.at(kCpu, type)(dlogits.data(), dl.data(), x.data(), lse.data(), t.data(), k.N, k.V,
                                               k.V);
      DeviceBuffer<uint16_t> dx(x), dd(filled<uint16_t>(n, seven));
      DeviceBuffer<float> ddl(dl), dloss(filled(rows, 5.0f)), dlse(filled(rows, 0.0f));
      DeviceBuffer<int32_t> dt(t);
      R().crossentropy_forward.at(kGpu, type)(dloss.get(), dlse.get(), dx.get(), dt.get(), k.N, k.V, k.V);
      expect_close(dloss.download(), loss, kF32Tol, "crossentropy losses");
      expect_close(dlse.download(), lse, kF32Tol, "crossentropy lse");
      DeviceBuffer<float> cl(lse);
      R().crossentropy_backward.at(kGpu, type)(dd.get(), ddl.get(), dx.get(), cl.get(), dt.get(), k.N, k.V, k.V);
      expect_close(from_half(type, dd.download()), from_half(type, dlogits), tol, "crossentropy dlogits");
    }
  }
}

// Rows ld apart (linear_cross_entropy's logits: GPT-2's V = 50257 in rows of 50304): the CPU's
// compact results within the tolerances above, and the padding columns neither read (NaN
// there) nor written (the prefill stays), in f32, bf16 and f16.
constexpr int64_t kCeRows = 37, kCeV = 50257, kCeLd = 50304;

template <typename T>
std::vector<T> spread_rows(const std::vector<T>& compact, T pad) {  // rows of kCeV into rows of kCeLd
  std::vector<T> out(static_cast<size_t>(kCeRows * kCeLd), pad);
  for (int64_t r = 0; r < kCeRows; ++r)
    std::copy(compact.begin() + r * kCeV, compact.begin() + (r + 1) * kCeV, out.begin() + r * kCeLd);
  return out;
}

template <typename T>
std::vector<T> compact_rows(const std::vector<T>& strided, T pad) {  // and back, checking the padding
  std::vector<T> out(static_cast<size_t>(kCeRows * kCeV));
  for (int64_t r = 0; r < kCeRows; ++r) {
    for (int64_t c = kCeV; c < kCeLd; ++c) {
      EXPECT_EQ(strided[r * kCeLd + c], pad) << "padding written at row " << r << ", column " << c;
      if (strided[r * kCeLd + c] != pad) return out;
    }
    std::copy(strided.begin() + r * kCeLd, strided.begin() + r * kCeLd + kCeV, out.begin() + r * kCeV);
  }
  return out;
}

TEST(CudaLayerKernels, CrossEntropyWithARowStrideMatchesCpu) {
  PT_REQUIRE_GPU();
  const CeCase k{kCeRows, kCeV};
  const size_t rows = static_cast<size_t>(k.N), n = rows * static_cast<size_t>(k.V);
  const std::vector<float> x = uniform(n, -3, 3, 26), dl = uniform(rows, 0.1f, 1.0f, 27);
  const std::vector<int32_t> t = targets_for(k);
  DeviceBuffer<float> ddl(dl);
  DeviceBuffer<int32_t> dt(t);
  {  // f32
    std::vector<float> loss(rows), lse(rows), dlogits(n);
    cpu::crossentropy_forward(loss.data(), lse.data(), x.data(), t.data(), k.N, k.V, k.V);
    cpu::crossentropy_backward(dlogits.data(), dl.data(), x.data(), lse.data(), t.data(), k.N, k.V, k.V);
    DeviceBuffer<float> dx(spread_rows(x, std::nanf(""))), dd(spread_rows(std::vector<float>(n, 7.0f), 7.0f));
    DeviceBuffer<float> dloss(filled(rows, 5.0f)), dlse(filled(rows, 0.0f));
    R().crossentropy_forward.at(kGpu, kF32)(dloss.get(), dlse.get(), dx.get(), dt.get(), k.N, k.V, kCeLd);
    R().crossentropy_backward.at(kGpu, kF32)(dd.get(), ddl.get(), dx.get(), dlse.get(), dt.get(), k.N, k.V, kCeLd);
    expect_close(dloss.download(), loss, kF32Tol, "strided f32 losses");
    expect_close(dlse.download(), lse, kF32Tol, "strided f32 lse");
    expect_close(compact_rows(dd.download(), 7.0f), dlogits, kF32Tol, "strided f32 dlogits");
  }
  for (DType type : {kBF16, DType::F16}) {  // against the CPU's kernel of the same type on the same values
    SCOPED_TRACE(dtype_name(type));
    const bool bf = type == kBF16;
    const std::vector<uint16_t> xh = to_half(type, x);
    std::vector<float> loss(rows), lse(rows);
    std::vector<uint16_t> dlogits(n);
    R().crossentropy_forward.at(kCpu, type)(loss.data(), lse.data(), xh.data(), t.data(), k.N, k.V, k.V);
    R().crossentropy_backward.at(kCpu, type)(dlogits.data(), dl.data(), xh.data(), lse.data(), t.data(), k.N, k.V,
                                             k.V);
    const uint16_t nan = bf ? 0x7fc0 : 0x7e00, seven = bf ? 0x40e0 : 0x4700;
    DeviceBuffer<uint16_t> dx(spread_rows(xh, nan)), dd(spread_rows(std::vector<uint16_t>(n, seven), seven));
    DeviceBuffer<float> dloss(filled(rows, 5.0f)), dlse(filled(rows, 0.0f));
    R().crossentropy_forward.at(kGpu, type)(dloss.get(), dlse.get(), dx.get(), dt.get(), k.N, k.V, kCeLd);
    R().crossentropy_backward.at(kGpu, type)(dd.get(), ddl.get(), dx.get(), dlse.get(), dt.get(), k.N, k.V, kCeLd);
    expect_close(dloss.download(), loss, kF32Tol, "strided half losses");
    expect_close(dlse.download(), lse, kF32Tol, "strided half lse");
    expect_close(from_half(type, compact_rows(dd.download(), seven)), from_half(type, dlogits),
                 bf ? kBF16Tol : kF16Tol, "strided half dlogits");
  }
}

// ---- attention ----

struct AttnCase {
  int64_t B, T, NH, hs;
};
constexpr AttnCase kAttnCases[] = {{1, 1, 1, 16},   {2, 37, 3, 64},  {1, 256, 2, 16}, {2, 256, 2, 64},
                                   {1, 37, 1, 128}, {3, 17, 4, 16}, {1, 1024, 2, 64}, {1, 200, 2, 128},
                                   {2, 100, 2, 32}};

std::string attn_name(const AttnCase& k) {
  return "B=" + std::to_string(k.B) + " T=" + std::to_string(k.T) + " NH=" + std::to_string(k.NH) +
         " hs=" + std::to_string(k.hs);
}

// The CUDA attentions: the tables' (PARATRAIN_CUDA_ATTENTION's form, gemm by default) and
// each form named, all against the CPU's fused attention.
using AttnForward = void (*)(void*, void*, const void*, int64_t, int64_t, int64_t, int64_t);
using AttnBackward = void (*)(void*, const void*, const void*, const void*, const void*, int64_t, int64_t, int64_t,
                              int64_t);
struct AttnImpl {
  const char* name;
  AttnForward f32_forward, bf16_forward;
  AttnBackward f32_backward, bf16_backward;
  int64_t max_head_size;
  Tolerance bf16_dqkv = kBF16Tol;  // bf16 products round P and dS: 4e-3 of the largest gradient
  Tolerance bf16_out = kBF16Tol;   // and P: 4e-3 of the largest output (1.4e-3 seen on an H200)
};
template <DType T, bool Half = false>
void by_gemm_forward(void* out, void* lse, const void* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  attention_by_gemm_forward<Device::CUDA, T>(out, lse, qkv, B, Tn, C, NH, 16, Half);  // small chunks: many of them
}
template <DType T, bool Half = false>
void by_gemm_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse, int64_t B,
                      int64_t Tn, int64_t C, int64_t NH) {
  attention_by_gemm_backward<Device::CUDA, T>(dqkv, dout, qkv, out, lse, B, Tn, C, NH, 16, Half);
}
// Whether the flash kernels (the f32-arithmetic ones, or the tensor-core ones) must take a shape
// on cuda:0: head sizes 32, 64 and 128 where the GPU's blocks may have the shared memory they
// need (all three from Ampere on; Turing: 32 and 64). Where they do not, the GEMM attention
// with f32 products runs, as the tables run it.
bool flash_takes(bool f32_arithmetic, int64_t C, int64_t NH) {
  const int64_t bytes = f32_arithmetic ? cuda::flash_attention_f32_shared_bytes(C / NH)
                                       : cuda::flash_attention_shared_bytes(C / NH);  // 0: not a head size of theirs
  int optin = 0;
  PT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  return bytes > 0 && bytes <= optin;
}
// The flash kernels as the tables run them under flash: f32 the f32-arithmetic ones (CUDA cores),
// bf16 and f16 the tensor-core ones; `F32Arithmetic`: the f32-arithmetic ones for every dtype
// (the tables' under tiles).
template <bool F32Arithmetic>
constexpr cuda::FlashKernels kFlashKernels =
    F32Arithmetic ? cuda::FlashKernels::kF32Arithmetic : cuda::FlashKernels::kTensorCores;
template <DType D = kBF16, bool F32Arithmetic = D == kF32>
void flash_forward(void* out, void* lse, const void* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  const bool taken = cuda::attention_forward_flash(kFlashKernels<F32Arithmetic>, D, out, static_cast<float*>(lse),
                                                   qkv, B, Tn, C, NH);
  EXPECT_EQ(taken, flash_takes(F32Arithmetic, C, NH)) << "the flash forward's shapes";
  if (!taken) by_gemm_forward<D>(out, lse, qkv, B, Tn, C, NH);
}
template <DType D = kBF16, bool F32Arithmetic = D == kF32>
void flash_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse, int64_t B,
                    int64_t Tn, int64_t C, int64_t NH) {
  const bool taken = cuda::attention_backward_flash(kFlashKernels<F32Arithmetic>, D, dqkv, dout, qkv, out,
                                                    static_cast<const float*>(lse), B, Tn, C, NH);
  EXPECT_EQ(taken, flash_takes(F32Arithmetic, C, NH)) << "the flash backward's shapes";
  if (!taken) by_gemm_backward<D>(dqkv, dout, qkv, out, lse, B, Tn, C, NH);
}
// flash_forward / flash_backward for a dtype the flash kernels take (f32, bf16, f16): the
// tensor-core kernels for bf16 and f16 unless `f32_arithmetic`.
AttnForward flash_forward_table(DType dt, bool f32_arithmetic = false) {
  if (dt == kF32) return &flash_forward<kF32>;
  if (dt == kBF16) return f32_arithmetic ? &flash_forward<kBF16, true> : &flash_forward<kBF16>;
  return f32_arithmetic ? &flash_forward<DType::F16, true> : &flash_forward<DType::F16>;
}
AttnBackward flash_backward_table(DType dt, bool f32_arithmetic = false) {
  if (dt == kF32) return &flash_backward<kF32>;
  if (dt == kBF16) return f32_arithmetic ? &flash_backward<kBF16, true> : &flash_backward<kBF16>;
  return f32_arithmetic ? &flash_backward<DType::F16, true> : &flash_backward<DType::F16>;
}
// The tables' bf16 attention rounds P and dS where PARATRAIN_CUDA_ATTENTION says flash or
// gemm-bf16: then the bf16-products tolerance.
std::vector<AttnImpl> attention_impls() {
  const Tolerance bf16_products{2e-2, 4e-3};
  const std::string form = env::get_string("PARATRAIN_CUDA_ATTENTION");
  const Tolerance table_bf16 = form == "flash" || form == "gemm-bf16" ? bf16_products : kBF16Tol;
  return {{"the table's", R().attention_forward.at(kGpu, kF32), R().attention_forward.at(kGpu, kBF16),
           R().attention_backward.at(kGpu, kF32), R().attention_backward.at(kGpu, kBF16), 1 << 20, table_bf16,
           table_bf16},
          {"flash", &flash_forward<kF32>, &flash_forward<>, &flash_backward<kF32>, &flash_backward<>, 1 << 20,
           bf16_products, bf16_products},
          {"flash, f32 arithmetic", &flash_forward<kF32>, &flash_forward<kBF16, true>, &flash_backward<kF32>,
           &flash_backward<kBF16, true>, 1 << 20},
          {"by gemm, 16-row chunks", &by_gemm_forward<kF32>, &by_gemm_forward<kBF16>, &by_gemm_backward<kF32>,
           &by_gemm_backward<kBF16>, 1 << 20},
          {"by gemm, bf16 products, 16-row chunks", &by_gemm_forward<kF32>, &by_gemm_forward<kBF16, true>,
           &by_gemm_backward<kF32>, &by_gemm_backward<kBF16, true>, 1 << 20, bf16_products, bf16_products}};
}
constexpr AttnCase kWideHead{2, 45, 2, 160};  // a head size past 128, which no flash kernel takes

// f(impl, case) for every attention and every case within its head size, traced by both.
template <typename F>
void each_attention_case(F&& f) {
  std::vector<AttnCase> cases(std::begin(kAttnCases), std::end(kAttnCases));
  cases.push_back(kWideHead);
  for (const AttnImpl& impl : attention_impls())
    for (const AttnCase& k : cases) {
      if (k.hs > impl.max_head_size) continue;
      SCOPED_TRACE(attn_name(k) + ", " + impl.name);
      f(impl, k);
    }
}

TEST(CudaLayerKernels, AttentionF32MatchesCpu) {
  PT_REQUIRE_GPU();
  each_attention_case([](const AttnImpl& impl, const AttnCase& k) {
    const int64_t C = k.NH * k.hs;
    const size_t nqkv = static_cast<size_t>(k.B * k.T * 3 * C), nout = static_cast<size_t>(k.B * k.T * C),
                 nlse = static_cast<size_t>(k.B * k.NH * k.T);
    const std::vector<float> qkv = uniform(nqkv, -2, 2, 31);
    std::vector<float> out(nout), lse(nlse);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), k.B, k.T, C, k.NH);

    DeviceBuffer<float> dqkv_in(qkv), dout_(filled(nout, 9.0f)), dlse(filled(nlse, 9.0f));
    impl.f32_forward(dout_.get(), dlse.get(), dqkv_in.get(), k.B, k.T, C, k.NH);
    expect_close(dout_.download(), out, kF32Tol, "attention out");
    expect_close(dlse.download(), lse, kF32Tol, "attention lse");
    // lse may be null (inference).
    DeviceBuffer<float> dout2(filled(nout, 0.0f));
    impl.f32_forward(dout2.get(), nullptr, dqkv_in.get(), k.B, k.T, C, k.NH);
    expect_close(dout2.download(), out, kF32Tol, "attention out without lse");

    // Backward from the CPU's out and lse into a prefilled dqkv.
    const std::vector<float> g = uniform(nout, -1, 1, 32), d0 = uniform(nqkv, -0.1f, 0.1f, 33);
    std::vector<float> d = d0;
    cpu::attention_backward(d.data(), g.data(), qkv.data(), out.data(), lse.data(), k.B, k.T, C, k.NH);
    DeviceBuffer<float> dg(g), cout_(out), clse(lse), dd(d0);
    impl.f32_backward(dd.get(), dg.get(), dqkv_in.get(), cout_.get(), clse.get(), k.B, k.T, C, k.NH);
    expect_close(dd.download(), d, kF32Tol, "attention dqkv", &d0);
  });
}

TEST(CudaLayerKernels, AttentionBF16MatchesCpu) {
  PT_REQUIRE_GPU();
  each_attention_case([](const AttnImpl& impl, const AttnCase& k) {
    const int64_t C = k.NH * k.hs;
    const size_t nqkv = static_cast<size_t>(k.B * k.T * 3 * C), nout = static_cast<size_t>(k.B * k.T * C),
                 nlse = static_cast<size_t>(k.B * k.NH * k.T);
    const std::vector<uint16_t> qkv = to_bf16(uniform(nqkv, -2, 2, 34));
    std::vector<uint16_t> out(nout);
    std::vector<float> lse(nlse);
    R().attention_forward.at(kCpu, kBF16)(out.data(), lse.data(), qkv.data(), k.B, k.T, C, k.NH);

    DeviceBuffer<uint16_t> dq(qkv), dout_(filled<uint16_t>(nout, 0));
    DeviceBuffer<float> dlse(filled(nlse, 9.0f));
    impl.bf16_forward(dout_.get(), dlse.get(), dq.get(), k.B, k.T, C, k.NH);
    expect_close(from_bf16(dout_.download()), from_bf16(out), impl.bf16_out, "attention bf16 out");
    expect_close(dlse.download(), lse, kF32Tol, "attention bf16 lse");  // f32 statistics of identical inputs

    const std::vector<uint16_t> g = to_bf16(uniform(nout, -1, 1, 35)), d0 = to_bf16(uniform(nqkv, -0.1f, 0.1f, 36));
    std::vector<uint16_t> d = d0;
    R().attention_backward.at(kCpu, kBF16)(d.data(), g.data(), qkv.data(), out.data(), lse.data(), k.B, k.T, C,
                                           k.NH);
    DeviceBuffer<uint16_t> dg(g), cout_(out), dd(d0);
    DeviceBuffer<float> clse(lse);
    impl.bf16_backward(dd.get(), dg.get(), dq.get(), cout_.get(), clse.get(), k.B, k.T, C, k.NH);
    // d includes the prefill: += is checked
    expect_close(from_bf16(dd.download()), from_bf16(d), impl.bf16_dqkv, "attention bf16 dqkv");
  });
}

// f16 (--precision fp16): the tables' attention (PARATRAIN_CUDA_ATTENTION's form: the GEMM
// attention with f32 products, or flash) and the flash kernels against the CPU's f16 attention
// on the same values. The GEMM form within f16's tolerance; flash rounds P and dS to f16 before
// their products (2^-11 relative), so 2e-3 of the largest value more (the f32 statistics within
// f32's either way). Head size 32 (gpt-nano's) and 64, T past two tiles.
TEST(CudaLayerKernels, F16AttentionMatchesCpu) {
  PT_REQUIRE_GPU();
  constexpr DType kF16 = DType::F16;
  const Tolerance f16_products{4e-3, 3e-3};
  const bool table_is_flash = env::get_string("PARATRAIN_CUDA_ATTENTION") == "flash";
  struct Impl {
    const char* name;
    AttnForward forward;
    AttnBackward backward;
    Tolerance tol;
  };
  const Impl impls[] = {
      {"the table's", R().attention_forward.at(kGpu, kF16), R().attention_backward.at(kGpu, kF16),
       table_is_flash ? f16_products : kF16Tol},
      {"flash", &flash_forward<kF16>, &flash_backward<kF16>, f16_products},
      {"flash, f32 arithmetic", &flash_forward<kF16, true>, &flash_backward<kF16, true>, kF16Tol}};
  for (const Impl& impl : impls)
    for (const int64_t hs : {32, 64}) {
      SCOPED_TRACE(std::string(impl.name) + ", head size " + std::to_string(hs));
      const int64_t B = 2, T = 150, NH = 3, C = NH * hs;
      const size_t nqkv = static_cast<size_t>(B * T * 3 * C), nout = static_cast<size_t>(B * T * C),
                   nlse = static_cast<size_t>(B * NH * T);
      const std::vector<uint16_t> qkv = to_half(kF16, uniform(nqkv, -2, 2, 61));
      std::vector<uint16_t> out(nout);
      std::vector<float> lse(nlse);
      R().attention_forward.at(kCpu, kF16)(out.data(), lse.data(), qkv.data(), B, T, C, NH);
      DeviceBuffer<uint16_t> dq(qkv), dout_(filled<uint16_t>(nout, 0));
      DeviceBuffer<float> dlse(filled(nlse, 9.0f));
      impl.forward(dout_.get(), dlse.get(), dq.get(), B, T, C, NH);
      expect_close(from_half(kF16, dout_.download()), from_half(kF16, out), impl.tol, "attention f16 out");
      expect_close(dlse.download(), lse, kF32Tol, "attention f16 lse");
      const std::vector<uint16_t> g = to_half(kF16, uniform(nout, -1, 1, 62)),
                                  d0 = to_half(kF16, uniform(nqkv, -0.1f, 0.1f, 63));
      std::vector<uint16_t> d = d0;
      R().attention_backward.at(kCpu, kF16)(d.data(), g.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
      DeviceBuffer<uint16_t> dg(g), cout_(out), dd(d0);
      DeviceBuffer<float> clse(lse);
      impl.backward(dd.get(), dg.get(), dq.get(), cout_.get(), clse.get(), B, T, C, NH);
      expect_close(from_half(kF16, dd.download()), from_half(kF16, d), impl.tol, "attention f16 dqkv");
    }
}

// The flash kernels' shared memory per block: head sizes 32 and 64 fit Turing's 64 KiB (f16
// flash runs there), 128 needs Ampere's or Ada's 99 KiB or more; other head sizes are not
// taken. And only bf16 and f16 are theirs: another dtype is an InputError, before any GPU is
// asked (this runs without one).
TEST(CudaLayerKernels, FlashSharedMemoryAndDtypes) {
  EXPECT_EQ(cuda::flash_attention_shared_bytes(64), 57856);  // the backward's 56.5 KiB
  EXPECT_LE(cuda::flash_attention_shared_bytes(32), 64 * 1024);
  EXPECT_GT(cuda::flash_attention_shared_bytes(128), 64 * 1024);
  EXPECT_LE(cuda::flash_attention_shared_bytes(128), 99 * 1024);
  EXPECT_EQ(cuda::flash_attention_shared_bytes(48), 0);
  EXPECT_EQ(cuda::flash_attention_shared_bytes(256), 0);
  // The f32 kernels (CUDA cores): head size 32 fits Turing's 64 KiB, 64 and 128 need Ampere's
  // or Ada's 99 KiB (64: the backward's 85.5 KiB) or an A100's or a Hopper's 163 KiB and more
  // (128: 149.5 KiB).
  EXPECT_LE(cuda::flash_attention_f32_shared_bytes(32), 64 * 1024);
  EXPECT_EQ(cuda::flash_attention_f32_shared_bytes(64), 87552);
  EXPECT_GT(cuda::flash_attention_f32_shared_bytes(128), 99 * 1024);
  EXPECT_LE(cuda::flash_attention_f32_shared_bytes(128), 163 * 1024);
  EXPECT_EQ(cuda::flash_attention_f32_shared_bytes(48), 0);
  uint16_t buf[8] = {};
  float lse[1] = {};
  using paratrain::testing::error_of;
  EXPECT_EQ(error_of<InputError>([&] { cuda::attention_forward_flash(DType::F32, buf, lse, buf, 1, 1, 64, 1); }),
            "attention_forward (cuda, flash): dtype f32 (the flash kernels take bf16 and f16)");
  EXPECT_EQ(
      error_of<InputError>([&] { cuda::attention_backward_flash(DType::F32, buf, buf, buf, buf, lse, 1, 1, 64, 1); }),
      "attention_backward (cuda, flash): dtype f32 (the flash kernels take bf16 and f16)");
  // The f32-arithmetic kernels take the three floating dtypes, and no other.
  EXPECT_EQ(error_of<InputError>(
                [&] { cuda::attention_forward_flash_f32(DType::I32, nullptr, nullptr, nullptr, 2, 10, 128, 2); }),
            "attention_forward (cuda, flash f32): dtype i32 (the f32-arithmetic flash kernels take f32, bf16 and f16)");
  EXPECT_EQ(error_of<InputError>([&] {
              cuda::attention_backward_flash_f32(DType::U8, nullptr, nullptr, nullptr, nullptr, lse, 2, 10, 128, 2);
            }),
            "attention_backward (cuda, flash f32): dtype u8 (the f32-arithmetic flash kernels take f32, bf16 and f16)");
  // The tables' entry (FlashKernels) sends f32 to the f32-arithmetic kernels whichever it is
  // asked for (here they refuse head size 80, where the tensor-core ones would throw for f32),
  // and the 16-bit dtypes to the kernels asked for.
  using cuda::FlashKernels;
  std::string why;
  EXPECT_FALSE(cuda::attention_forward_flash(FlashKernels::kTensorCores, kF32, nullptr, nullptr, nullptr, 2, 10,
                                             2 * 80, 2, &why));
  EXPECT_EQ(why, "head size 80 (they take 32, 64 and 128)");
  EXPECT_FALSE(cuda::attention_backward_flash(FlashKernels::kTensorCores, kF32, nullptr, nullptr, nullptr, nullptr,
                                              lse, 2, 10, 2 * 80, 2));
  EXPECT_EQ(error_of<InputError>([&] {
              cuda::attention_forward_flash(FlashKernels::kTensorCores, DType::I32, nullptr, nullptr, nullptr, 2, 10,
                                            128, 2);
            }),
            "attention_forward (cuda, flash): dtype i32 (the flash kernels take bf16 and f16)");
  EXPECT_EQ(error_of<InputError>([&] {
              cuda::attention_backward_flash(FlashKernels::kF32Arithmetic, DType::I32, nullptr, nullptr, nullptr,
                                             nullptr, lse, 2, 10, 128, 2);
            }),
            "attention_backward (cuda, flash f32): dtype i32 (the f32-arithmetic flash kernels take f32, bf16 and f16)");
}

// Why the flash kernels do not take an attention, in words (what PARATRAIN_CUDA_ATTENTION=flash
// warns once before running it as gemm): the shapes they never take, and the reasons a GPU or
// the buffers give for stand-in GPUs (this part runs without one); then the current GPU's.
TEST(CudaLayerKernels, FlashSaysWhyItDoesNotTakeAnAttention) {
  alignas(16) uint16_t buf[16] = {};
  EXPECT_EQ(cuda::flash_attention_refusal(kBF16, 2, 10, 2 * 80, 2, buf), "head size 80 (they take 32, 64 and 128)");
  EXPECT_EQ(cuda::flash_attention_refusal(DType::F16, 70000, 10, 64, 1, buf),
            "B * NH = 70000, more than one launch takes (65535)");
  EXPECT_EQ(cuda::flash_attention_refusal(kF32, 2, 10, 2 * 80, 2, buf), "head size 80 (they take 32, 64 and 128)");
  EXPECT_EQ(paratrain::testing::error_of<InputError>(
                [&] { cuda::flash_attention_refusal(DType::I32, 1, 10, 64, 1, buf); }),
            "flash_attention_refusal (cuda): dtype i32 (flash attention takes f32, bf16 and f16)");
  // The forward hands the same reason back (what the table's warning prints), running nothing.
  std::string why;
  float lse[10] = {};
  EXPECT_FALSE(cuda::attention_forward_flash(kBF16, buf, lse, buf, 2, 10, 2 * 80, 2, &why));
  EXPECT_EQ(why, "head size 80 (they take 32, 64 and 128)");
  why.clear();
  EXPECT_FALSE(cuda::attention_forward_flash_f32(kBF16, nullptr, nullptr, nullptr, 2, 10, 2 * 80, 2, &why));
  EXPECT_EQ(why, "head size 80 (they take 32, 64 and 128)");
  // The GPU's part of the reasons, for stand-in GPUs: a Turing (bf16 WMMA needs Ampere; 64 KiB
  // of shared memory a block, less than head size 128 needs) and a Hopper, then the buffers'
  // alignment.
  using cuda::detail::FlashDevice;
  const FlashDevice turing(1, 750, 64 * 1024), hopper(0, 900, 227 * 1024);
  EXPECT_EQ(cuda::detail::flash_arch_refusal(turing, 800, "bf16"),
            "cuda:1 is compute capability 7.5, and WMMA on bf16 needs 8.0");
  EXPECT_EQ(cuda::detail::flash_arch_refusal(turing, 700, "f16"), "");
  EXPECT_EQ(cuda::detail::flash_arch_refusal(hopper, 800, "bf16"), "");
  const int64_t f32_hs128 = cuda::flash_attention_f32_shared_bytes(128);
  EXPECT_EQ(cuda::detail::flash_device_refusal(256, 2, f32_hs128, turing, buf, nullptr),
            "head size 128 needs 153088 bytes of shared memory a block, and cuda:1 gives 65536");
  EXPECT_EQ(cuda::detail::flash_device_refusal(256, 2, f32_hs128, hopper, buf, buf), "");
  EXPECT_EQ(cuda::detail::flash_device_refusal(256, 2, f32_hs128, hopper, buf + 1, buf), "qkv is not 16-byte aligned");
  EXPECT_EQ(cuda::detail::flash_device_refusal(256, 2, f32_hs128, hopper, buf, buf + 3),
            "dout is not 16-byte aligned");
  EXPECT_EQ(cuda::detail::flash_device_refusal(256, 2, f32_hs128, hopper, buf, nullptr), "") << "no dout: the forward";
  PT_REQUIRE_GPU();
  for (const DType dt : {kF32, kBF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    EXPECT_EQ(cuda::flash_attention_refusal(dt, 2, 10, 128, 2, buf), "") << "head size 64 on an Ampere or newer GPU";
    EXPECT_EQ(cuda::flash_attention_refusal(dt, 2, 10, 128, 2, buf + 1), "qkv is not 16-byte aligned");
    EXPECT_EQ(cuda::flash_attention_refusal(dt, 2, 10, 128, 2, buf, buf + 3), "dout is not 16-byte aligned");
  }
}

// The flash backward has one writer per element of dqkv (no atomics): two runs give the same
// bits, and so does the forward; f32 (the CUDA-core kernels), bf16 and f16.
template <typename V>
void expect_flash_same_bits(DType dt, const std::vector<V>& qkv, const std::vector<V>& g, int64_t B, int64_t T,
                            int64_t C, int64_t NH, bool f32_arithmetic = false) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + (f32_arithmetic ? ", f32 arithmetic" : ""));
  DeviceBuffer<V> dq(qkv), dg(g);
  std::vector<V> first_out, first_d;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<V> out(filled<V>(g.size(), V{})), d(filled<V>(qkv.size(), V{}));
    DeviceBuffer<float> lse(filled(static_cast<size_t>(B * NH * T), 0.0f));
    flash_forward_table(dt, f32_arithmetic)(out.get(), lse.get(), dq.get(), B, T, C, NH);
    flash_backward_table(dt, f32_arithmetic)(d.get(), dg.get(), dq.get(), out.get(), lse.get(), B, T, C, NH);
    if (run == 0) {
      first_out = out.download(), first_d = d.download();
    } else {
      EXPECT_EQ(out.download(), first_out);
      EXPECT_EQ(d.download(), first_d);
    }
  }
  EXPECT_NE(std::count(first_d.begin(), first_d.end(), V{}), static_cast<std::ptrdiff_t>(qkv.size()));
}

TEST(CudaLayerKernels, FlashAttentionIsTheSameBitsEveryRun) {
  PT_REQUIRE_GPU();
  const int64_t B = 2, T = 300, NH = 2, hs = 64, C = NH * hs;
  const size_t nqkv = static_cast<size_t>(B * T * 3 * C), nout = static_cast<size_t>(B * T * C);
  const std::vector<float> qkv = uniform(nqkv, -2, 2, 51), g = uniform(nout, -1, 1, 52);
  expect_flash_same_bits(kF32, qkv, g, B, T, C, NH);
  for (const DType dt : {kBF16, DType::F16}) {
    expect_flash_same_bits(dt, to_half(dt, qkv), to_half(dt, g), B, T, C, NH);
    expect_flash_same_bits(dt, to_half(dt, qkv), to_half(dt, g), B, T, C, NH, true);
  }
}

// The pieces of the GEMM attention one by one against the CPU's (kernels/cpu/attention_parts.h):
// a failure here names the piece.
// Each piece at a small shape and at one whose rows are longer than a block's 256 threads
// (split/merge: P*C = 2304; probs/dscores: 300 keys; rowdot: hs = 64, and a last block of
// rows partly past the end).
struct PartsCase {
  int64_t B, T, NH, hs, r0, rows;
};
constexpr PartsCase kPartsCases[] = {{2, 21, 3, 8, 7, 9}, {2, 300, 12, 64, 256, 44}};

TEST(CudaLayerKernels, AttentionPartsMatchCpu) {
  PT_REQUIRE_GPU();
  for (const PartsCase& pc : kPartsCases) {
    const int64_t B = pc.B, T = pc.T, NH = pc.NH, hs = pc.hs, C = NH * hs, BH = B * NH, r0 = pc.r0, rows = pc.rows,
                  keys = r0 + rows;
    SCOPED_TRACE(attn_name({B, T, NH, hs}));
    for (int64_t P : {1, 3}) {
      const auto x = uniform(static_cast<size_t>(B * T * P * C), -2, 2, 40);
      std::vector<float> heads(x.size());
      cpu::attention_split_heads(heads.data(), x.data(), B, T, C, NH, P);
      DeviceBuffer<float> dx(x), dheads(filled(x.size(), 0.0f));
      R().attention_split_heads.at(kGpu, kF32)(dheads.get(), dx.get(), B, T, C, NH, P);
      expect_close(dheads.download(), heads, kF32Tol, "split_heads");
      const auto xb = to_bf16(x);
      std::vector<float> hb(x.size());
      cpu::attention_split_heads_bf16(hb.data(), xb.data(), B, T, C, NH, P);
      DeviceBuffer<uint16_t> dxb(xb);
      R().attention_split_heads.at(kGpu, kBF16)(dheads.get(), dxb.get(), B, T, C, NH, P);
      expect_close(dheads.download(), hb, kF32Tol, "split_heads bf16");
      for (bool acc : {false, true}) {
        std::vector<float> y = x;
        cpu::attention_merge_heads(y.data(), heads.data(), B, T, C, NH, P, acc);
        DeviceBuffer<float> dy(x), dh(heads);
        R().attention_merge_heads.at(kGpu, kF32)(dy.get(), dh.get(), B, T, C, NH, P, acc);
        expect_close(dy.download(), y, kF32Tol, "merge_heads");
        std::vector<uint16_t> yb = xb;
        cpu::attention_merge_heads_bf16(yb.data(), heads.data(), B, T, C, NH, P, acc);
        DeviceBuffer<uint16_t> dyb(xb);
        R().attention_merge_heads.at(kGpu, kBF16)(dyb.get(), dh.get(), B, T, C, NH, P, acc);
        expect_close_bf16(dyb.download(), yb, "merge_heads bf16");
      }
    }
    const auto S = uniform(static_cast<size_t>(BH * rows * keys), -3, 3, 41);
    std::vector<float> soft = S, lse(static_cast<size_t>(BH * T), 0.0f);
    cpu::attention_chunk_softmax(soft.data(), lse.data(), BH, T, r0, rows);
    DeviceBuffer<float> dS(S), dlse(filled(lse.size(), 0.0f));
    R().attention_chunk_softmax.at(kGpu, kF32)(dS.get(), dlse.get(), BH, T, r0, rows);
    expect_close(dS.download(), soft, kF32Tol, "chunk_softmax");
    // lse only of the chunk's rows (the others stay 0 on both sides)
    expect_close(dlse.download(), lse, kF32Tol, "chunk_softmax lse");
    std::vector<float> probs = S;
    cpu::attention_chunk_probs(probs.data(), lse.data(), BH, T, r0, rows);
    DeviceBuffer<float> dP(S), clse(lse);
    R().attention_chunk_probs.at(kGpu, kF32)(dP.get(), clse.get(), BH, T, r0, rows);
    expect_close(dP.download(), probs, kF32Tol, "chunk_probs");
    const auto dp0 = uniform(S.size(), -1, 1, 42), Dsum = uniform(lse.size(), -1, 1, 43);
    std::vector<float> ds = dp0;
    cpu::attention_chunk_dscores(ds.data(), probs.data(), Dsum.data(), BH, T, r0, rows);
    DeviceBuffer<float> dds(dp0), dprobs(probs), dD(Dsum);
    R().attention_chunk_dscores.at(kGpu, kF32)(dds.get(), dprobs.get(), dD.get(), BH, T, r0, rows);
    expect_close(dds.download(), ds, kF32Tol, "chunk_dscores");
    const auto a = uniform(static_cast<size_t>(BH * T * hs), -1, 1, 44), b = uniform(a.size(), -1, 1, 45);
    std::vector<float> dot(static_cast<size_t>(BH * T));
    cpu::attention_rowdot(dot.data(), a.data(), b.data(), BH, T, hs);
    DeviceBuffer<float> da(a), db(b), ddot(filled(dot.size(), 0.0f));
    R().attention_rowdot.at(kGpu, kF32)(ddot.get(), da.get(), db.get(), BH, T, hs);
    expect_close(ddot.download(), dot, kF32Tol, "rowdot");
  }
}

// The pieces' launch limits are checked before any CUDA call: no GPU needed. A block per row
// takes at most 2^31 - 1 rows of qkv (B*T), and the warps of rowdot as many blocks of 8 rows.
TEST(CudaLayerKernels, AttentionPiecesNameRowsPastOneLaunch) {
  const int64_t B = int64_t{1} << 20, T = int64_t{1} << 12;  // 2^32 rows
  const std::string split = paratrain::testing::error_of<InputError>(
      [&] { cuda::attention_split_heads(nullptr, nullptr, B, T, 8, 1, 3); });
  EXPECT_NE(split.find("attention_split_heads (cuda): 4294967296 rows of 24 is more than one launch takes"),
            std::string::npos)
      << split;
  const std::string merge = paratrain::testing::error_of<InputError>(
      [&] { cuda::attention_merge_heads_bf16(nullptr, nullptr, B, T, 8, 1, 1, false); });
  EXPECT_NE(merge.find("attention_merge_heads (cuda): 4294967296 rows of 8 is more than one launch takes"),
            std::string::npos)
      << merge;
  const std::string rowdot = paratrain::testing::error_of<InputError>(
      [&] { cuda::attention_rowdot(nullptr, nullptr, nullptr, int64_t{1} << 24, int64_t{1} << 10, 64); });
  EXPECT_NE(rowdot.find("attention_rowdot (cuda): 17179869184 rows is more than one launch takes"), std::string::npos)
      << rowdot;
}

}  // namespace
}  // namespace paratrain::kernels
