// The CUDA conv2d and max-pool kernels (src/kernels/cuda/conv.cpp) against the CPU kernels,
// through the dispatch tables for Device::CUDA: odd sizes, strides below, equal to and above
// the kernel size, padding, no bias, several chunks of images, the backward's nullptr
// gradients, and gradient buffers prefilled with non-zero values (the backward's +=).
//
// Tolerances, per element, with M = max |want| over the tensor:
//   conv2d f32:  |got - want| <= 1e-5 |want| + 5e-5 M. Both sides are f32 GEMMs over the same
//                im2col values (cuBLASLt with exact f32 compute, no TF32); only the order of
//                the K sums (up to Ci*K*K = 576 terms forward, N*Ho*Wo = 4096+ for dweight)
//                and of the bias sum differ, a few ulps of the magnitudes summed, which scale
//                with M. For the accumulated gradients the increments got - base and want -
//                base are compared (M their largest), with 4 ulps of |base| for the adds.
//                (With the CPU GEMM in place of cuBLASLt the worst case here was 5.5e-6 M.)
//   conv2d bf16: 1e-2 |want| + 2e-3 M; f16: 2e-3 |want| + 2e-4 M. The CPU computes in f32 on
//                the widened values and rounds once (kernels/cpu/half.h); the GPU multiplies
//                the half values on tensor cores, each product exact in the f32 accumulator,
//                and rounds once, so they differ by the f32 order of the sums (and the tensor
//                cores' own f32 adds) and at most one rounding flip (2^-8, 2^-11 relative).
//   max-pool:    exact, every dtype: the same window scan (argmax, ties, NaN), and the backward
//                adds each plane's outputs in the CPU's order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "support/conv_case.h"
#include "support/expect_values.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/conv.h"
#include "paratrain/kernels/cpu/elementwise.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::kernels {
namespace {

using test::ConvCase;
using test::DevBuf;

constexpr Device kGpu = Device::CUDA;
constexpr Device kCpu = Device::CPU;

using test::expect_close;
using test::expect_same_bits;
using test::Tolerance;
constexpr Tolerance kF32Tol{1e-5, 5e-5};
constexpr Tolerance kBF16Tol{1e-2, 2e-3};
constexpr Tolerance kF16Tol{2e-3, 2e-4};

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Host values of dtype t (float for F32, bf16/f16 bits otherwise) as f32, and back.
std::vector<float> widen(DType t, const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  if (t == DType::BF16) cpu::bf16_to_f32(f.data(), h.data(), static_cast<int64_t>(h.size()));
  else cpu::f16_to_f32(f.data(), h.data(), static_cast<int64_t>(h.size()));
  return f;
}
std::vector<uint16_t> narrow(DType t, const std::vector<float>& f) {
  std::vector<uint16_t> h(f.size());
  if (t == DType::BF16) cpu::f32_to_bf16(h.data(), f.data(), static_cast<int64_t>(f.size()));
  else cpu::f32_to_f16(h.data(), f.data(), static_cast<int64_t>(f.size()));
  return h;
}

// One operand in dtype t: its host bytes (for the CPU kernel, modified in place), a device
// copy, and its values as f32.
struct Operand {
  DType t;
  std::vector<float> f32;     // F32 data
  std::vector<uint16_t> half;  // BF16/F16 bits
  Operand(DType dtype, const std::vector<float>& v) : t(dtype) {
    if (t == DType::F32) f32 = v;
    else half = narrow(t, v);
  }
  void* host() { return t == DType::F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(half.data()); }
  std::unique_ptr<DevBuf> upload() const {
    return t == DType::F32 ? std::make_unique<DevBuf>(f32) : std::make_unique<DevBuf>(half);
  }
  // The device buffer's values as f32.
  std::vector<float> values(const DevBuf& d) const {
    return t == DType::F32 ? d.get<float>() : widen(t, d.get<uint16_t>());
  }
  std::vector<float> values() const { return t == DType::F32 ? f32 : widen(t, half); }
};

const std::vector<ConvCase> kConvCases = {
    {3, 2, 7, 9, 5, 3, 1, 1, true},      // odd sizes, "same" padding
    {2, 3, 11, 6, 4, 5, 2, 2, true},     // stride 2, K 5
    {2, 3, 8, 10, 3, 2, 3, 0, false},    // stride above K (taps skip pixels), no bias
    {2, 1, 5, 5, 2, 5, 1, 0, true},      // one output pixel
    {1, 2, 4, 5, 3, 3, 2, 1, false},     // padding with stride 2
    {2, 4, 6, 6, 3, 1, 1, 0, true},      // 1x1
    {1, 1, 28, 28, 32, 3, 1, 1, true},   // the CNN's conv1
    {4, 32, 14, 14, 64, 3, 1, 1, true},  // the CNN's conv2
    {9, 64, 64, 64, 8, 3, 1, 1, true},   // 2.4M floats of im2col per image: several chunks
};

// Forward, then the full backward into prefilled gradients, then the backward with one
// gradient wanted at a time (the others nullptr), on the GPU and the CPU.
void check_conv(DType t, const ConvCase& c, Tolerance tol) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " " + c.name());
  const int64_t Ho = cpu::conv2d_out_size(c.H, c.K, c.stride, c.pad), Wo = cpu::conv2d_out_size(c.W, c.K, c.stride, c.pad);
  const size_t n_in = c.N * c.Ci * c.H * c.W, n_w = c.Co * c.Ci * c.K * c.K, n_out = c.N * c.Co * Ho * Wo;
  const uint32_t seed = static_cast<uint32_t>(c.N * 1000 + c.Ci * 100 + c.K * 10 + c.stride);
  Operand inp(t, uniform(n_in, -1, 1, seed)), weight(t, uniform(n_w, -0.5f, 0.5f, seed + 1)),
      bias(t, uniform(c.Co, -1, 1, seed + 2)), dout(t, uniform(n_out, -1, 1, seed + 3));
  Operand out(t, std::vector<float>(n_out, 0.0f));
  auto d_inp = inp.upload(), d_w = weight.upload(), d_b = bias.upload(), d_dout = dout.upload(), d_out = out.upload();
  PT_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads are done before the compute stream reads them

  const auto& fwd = registry().conv2d_forward;
  fwd.at(kGpu, t)(d_out->p, d_inp->p, d_w->p, c.bias ? d_b->p : nullptr, c.N, c.Ci, c.H, c.W, c.Co, c.K, c.stride,
                  c.pad);
  fwd.at(kCpu, t)(out.host(), inp.host(), weight.host(), c.bias ? bias.host() : nullptr, c.N, c.Ci, c.H, c.W, c.Co,
                  c.K, c.stride, c.pad);
  expect_close(out.values(*d_out), out.values(), tol, "out");

  const auto& bwd = registry().conv2d_backward;
  const std::vector<float> base_in = uniform(n_in, -2, 2, seed + 4), base_w = uniform(n_w, -2, 2, seed + 5),
                           base_b = uniform(c.Co, -2, 2, seed + 6);
  // wanted: bit 0 dinp, bit 1 dweight, bit 2 dbias
  for (int wanted : {7, 1, 2, 4}) {
    SCOPED_TRACE("gradients wanted: " + std::to_string(wanted));
    const bool want_b = (wanted & 4) && c.bias;
    if ((wanted & 4) && !c.bias) continue;
    Operand dinp(t, base_in), dw(t, base_w), db(t, base_b);
    const std::vector<float> b_in = dinp.values(), b_w = dw.values(), b_b = db.values();  // as rounded to t
    auto d_dinp = dinp.upload(), d_dw = dw.upload(), d_db = db.upload();
    PT_CUDA_CHECK(cudaDeviceSynchronize());
    bwd.at(kGpu, t)((wanted & 1) ? d_dinp->p : nullptr, (wanted & 2) ? d_dw->p : nullptr, want_b ? d_db->p : nullptr,
                    d_dout->p, d_inp->p, d_w->p, c.N, c.Ci, c.H, c.W, c.Co, c.K, c.stride, c.pad);
    bwd.at(kCpu, t)((wanted & 1) ? dinp.host() : nullptr, (wanted & 2) ? dw.host() : nullptr,
                    want_b ? db.host() : nullptr, dout.host(), inp.host(), weight.host(), c.N, c.Ci, c.H, c.W, c.Co,
                    c.K, c.stride, c.pad);
    // f32: the increments (see the header); halves: the rounded totals. A gradient not
    // wanted keeps its old values, bit for bit.
    const std::vector<float>* bi = t == DType::F32 ? &b_in : nullptr;
    const std::vector<float>* bw = t == DType::F32 ? &b_w : nullptr;
    const std::vector<float>* bb = t == DType::F32 ? &b_b : nullptr;
    if (wanted & 1) expect_close(dinp.values(*d_dinp), dinp.values(), tol, "dinp", bi);
    else expect_same_bits(dinp.values(*d_dinp), b_in, "dinp (not wanted)");
    if (wanted & 2) expect_close(dw.values(*d_dw), dw.values(), tol, "dweight", bw);
    else expect_same_bits(dw.values(*d_dw), b_w, "dweight (not wanted)");
    if (want_b) expect_close(db.values(*d_db), db.values(), tol, "dbias", bb);
    else expect_same_bits(db.values(*d_db), b_b, "dbias (not wanted)");
  }
}

TEST(ConvKernelsOnGpu, Conv2dF32MatchesTheCpu) {
  PT_REQUIRE_GPU();
  for (const auto& c : kConvCases) check_conv(DType::F32, c, kF32Tol);
}

TEST(ConvKernelsOnGpu, Conv2dHalvesMatchTheCpu) {
  PT_REQUIRE_GPU();
  for (const auto& c : kConvCases) {  // the chunked case too: the halves' GEMMs take their own buffers
    check_conv(DType::BF16, c, kBF16Tol);
    check_conv(DType::F16, c, kF16Tol);
  }
}

TEST(ConvKernelsOnGpu, Conv2dRefusesBadSizesAsTheCpuDoes) {
  PT_REQUIRE_GPU();
  const auto& fwd = registry().conv2d_forward.at(kGpu, DType::F32);
  // nothing is queued: the pointers are never read
  EXPECT_THROW(fwd(nullptr, nullptr, nullptr, nullptr, 1, 1, 3, 3, 1, 5, 1, 0), InputError);  // K above H + 2 pad
  EXPECT_THROW(fwd(nullptr, nullptr, nullptr, nullptr, 1, 0, 3, 3, 1, 1, 1, 0), InputError);  // no channels
  EXPECT_THROW(fwd(nullptr, nullptr, nullptr, nullptr, 1, 1, 3, 3, 1, 1, 0, 0), InputError);  // stride 0
  const auto& bwd = registry().conv2d_backward.at(kGpu, DType::BF16);
  EXPECT_THROW(bwd(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 3, 3, 1, 3, 1, -1), InputError);
  const auto& pool = registry().maxpool2d_forward.at(kGpu, DType::F32);
  EXPECT_THROW(pool(nullptr, nullptr, nullptr, 1, 1, 4, 4, 2, 2, 2), InputError);  // pad above K/2
  // N = 0 is nothing to do
  fwd(nullptr, nullptr, nullptr, nullptr, 0, 1, 3, 3, 1, 3, 1, 1);
  PT_CUDA_CHECK(cudaDeviceSynchronize());
}

struct PoolCase {
  int64_t N, C, H, W, K, stride, pad;
};
const std::vector<PoolCase> kPoolCases = {
    {2, 3, 28, 28, 2, 2, 0},  // the CNN's pool
    {3, 2, 7, 9, 2, 2, 0},    // odd sizes: the last row and column are dropped
    {2, 3, 7, 9, 3, 2, 1},    // padding
    {1, 2, 5, 6, 3, 1, 1},    // overlapping windows: inputs routed to by several outputs
    {2, 2, 8, 8, 2, 1, 0},    // overlapping, unpadded
    {1, 1, 6, 6, 4, 2, 2},    // pad K/2
};

// Values with many ties (a few levels) and, for `specials`, NaNs and -inf.
std::vector<float> pool_input(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(-3, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = 0.5f * static_cast<float>(level(rng));
  if (specials)
    for (size_t i = 5; i < n; i += 37) v[i] = (i / 37) % 2 ? std::numeric_limits<float>::quiet_NaN()
                                                            : -std::numeric_limits<float>::infinity();
  return v;
}

void check_pool(DType t, const PoolCase& c, bool specials) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " N" + std::to_string(c.N) + " C" + std::to_string(c.C) + " " +
               std::to_string(c.H) + "x" + std::to_string(c.W) + " K" + std::to_string(c.K) + " s" +
               std::to_string(c.stride) + " p" + std::to_string(c.pad) + (specials ? " NaN/-inf" : ""));
  const int64_t Ho = cpu::conv2d_out_size(c.H, c.K, c.stride, c.pad), Wo = cpu::conv2d_out_size(c.W, c.K, c.stride, c.pad);
  const size_t n_in = c.N * c.C * c.H * c.W, n_out = c.N * c.C * Ho * Wo;
  const uint32_t seed = static_cast<uint32_t>(c.H * 100 + c.K * 10 + c.stride);
  Operand inp(t, pool_input(n_in, seed, specials)), out(t, std::vector<float>(n_out, 0.0f));
  Operand dout(t, uniform(n_out, -1, 1, seed + 1)), dinp(t, uniform(n_in, -1, 1, seed + 2));
  std::vector<int32_t> argmax(n_out, -7);
  auto d_inp = inp.upload(), d_out = out.upload(), d_dout = dout.upload(), d_dinp = dinp.upload();
  DevBuf d_arg(argmax);
  PT_CUDA_CHECK(cudaDeviceSynchronize());
  registry().maxpool2d_forward.at(kGpu, t)(d_out->p, static_cast<int32_t*>(d_arg.p), d_inp->p, c.N, c.C, c.H, c.W,
                                           c.K, c.stride, c.pad);
  registry().maxpool2d_forward.at(kCpu, t)(out.host(), argmax.data(), inp.host(), c.N, c.C, c.H, c.W, c.K, c.stride,
                                           c.pad);
  EXPECT_EQ(d_arg.get<int32_t>(), argmax);
  expect_same_bits(out.values(*d_out), out.values(), "out");
  registry().maxpool2d_backward.at(kGpu, t)(d_dinp->p, d_dout->p, static_cast<const int32_t*>(d_arg.p), c.N, c.C,
                                            c.H, c.W, Ho, Wo);
  registry().maxpool2d_backward.at(kCpu, t)(dinp.host(), dout.host(), argmax.data(), c.N, c.C, c.H, c.W, Ho, Wo);
  expect_same_bits(dinp.values(*d_dinp), dinp.values(), "dinp");
}

TEST(ConvKernelsOnGpu, MaxPoolIsTheCpusBitForBit) {
  PT_REQUIRE_GPU();
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (const auto& c : kPoolCases)
      for (bool specials : {false, true}) check_pool(t, c, specials);
}

}  // namespace
}  // namespace paratrain::kernels
