// The CUDA conv2d and max-pool run on the CPU: their host algorithm (kernels/cuda/conv_steps.h:
// the chunks of images, the passes and GEMMs of each chunk with their transposes, leading
// dimensions and betas), over Ops whose device passes are the kernels of conv_kernels.cuh on
// the emulated CUDA built-ins (tests/kernels/cuda_emulation.h; the bias gradient's block of 256
// threads with block_reduce.cuh's block_sum over them) and whose GEMM is a plain loop on the
// widened operands with f32 sums (what cuBLASLt computes: each product of two half values is
// exact in f32).
// Scratch starts as NaN, so a read of what no pass wrote shows. Against the CPU kernels
// (registry tables, Device::CPU) in f32, bf16 and f16, with the real chunk size and with chunks
// of one and two images, every gradient and each alone, into prefilled gradients; tolerances
// those of tests/gpu/conv_kernels_test.cpp (the sums' order; for halves one rounding). Max-pool:
// bit for bit, NaN and ties included. The GPU runs the same code (ConvKernelsOnGpu.*); this
// checks it without one. Adding dweight with beta 0 (each chunk overwriting the last's) fails it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda_emulation.h"
#include "kernels/emulated_elements.h"
#include "kernels/test_util.h"
#include "paratrain/kernels/cpu/conv.h"
#include "paratrain/kernels/registry.h"
#include "support/conv_case.h"
#include "support/expect_values.h"

#include "kernels/cuda/block_reduce.cuh"

namespace paratrain::kernels::cuda::conv_detail {
using detail::block_sum;  // as conv_kernels.cu
}  // namespace paratrain::kernels::cuda::conv_detail

#include "kernels/cuda/conv_kernels.cuh"
#include "kernels/cuda/conv_steps.h"

namespace {
using paratrain::Device;
using paratrain::DType;
using paratrain::kernels::registry;
using paratrain::kernels::cpu::testing::uniform;
namespace conv = paratrain::kernels::cuda::conv_detail;
namespace emulated = paratrain::kernels::emulated;

using paratrain::kernels::cuda::detail::grid_for;  // the launches' grids (grid_stride.cuh)
using paratrain::kernels::cuda::detail::kThreads;

struct HostBuffer {
  std::shared_ptr<std::vector<unsigned char>> mem;
  void* data_ptr() const { return mem ? mem->data() : nullptr; }
};

// conv_steps.h's Ops on the CPU for the element rules E.
template <typename E>
struct EmulatedOps {
  using S = typename E::S;
  HostBuffer scratch(int64_t n, DType dtype) const {  // NaN in every dtype (all bits set)
    return {std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(n) * paratrain::dtype_size(dtype), 0xff)};
  }
  void im2col(void* col, const void* inp, int64_t cnt, const conv::Geom& g) const {
    launch_serial(grid_for(g.rows() * cnt * g.cols()), 1, kThreads,
                  [&] { conv::im2col_kernel<E>(static_cast<S*>(col), static_cast<const S*>(inp), cnt, g); });
  }
  void col2im_add(void* dinp, const float* dcol, int64_t cnt, const conv::Geom& g) const {
    launch_serial(grid_for(cnt * g.Ci * g.H * g.W), 1, kThreads,
                  [&] { conv::col2im_add_kernel<E>(static_cast<S*>(dinp), dcol, cnt, g); });
  }
  void out_from_channel_major(void* out, const float* cm, const void* bias, int64_t cnt, int64_t Co, int64_t L) const {
    launch_serial(grid_for(cnt * Co * L), 1, kThreads, [&] {
      conv::out_from_channel_major_kernel<E>(static_cast<S*>(out), cm, static_cast<const S*>(bias), cnt, Co, L);
    });
  }
  void channel_major_from(void* cm, const void* dout, int64_t cnt, int64_t Co, int64_t L) const {
    launch_serial(grid_for(Co * cnt * L), 1, kThreads, [&] {
      conv::channel_major_from_kernel<E>(static_cast<S*>(cm), static_cast<const S*>(dout), cnt, Co, L);
    });
  }
  void bias_grad(void* dbias, const void* dout, int64_t N, int64_t Co, int64_t L) const {
    launch(static_cast<unsigned>(Co), 1, conv::kBiasThreads,
           [&] { conv::bias_grad_kernel<E>(static_cast<S*>(dbias), static_cast<const S*>(dout), N, Co, L); });
  }
  void maxpool_backward_planes(float* d, const void* dout, const int32_t* argmax, int64_t planes, int64_t HW,
                               int64_t HoWo) const {
    launch_serial(grid_for(planes), 1, kThreads, [&] {
      conv::maxpool_backward_planes_kernel<E>(d, static_cast<const S*>(dout), argmax, planes, HW, HoWo);
    });
  }
  // Row-major C (M x N) = op(A) op(B) + beta C: A (M x K, or K x M when ta), B (K x N, or N x K
  // when tb), f32 sums of the widened operands' products.
  void gemm_into_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                     int64_t ldb, float beta, float* C, int64_t ldc) const {
    const auto* a = static_cast<const S*>(A);
    const auto* b = static_cast<const S*>(B);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; ++k)
          s += E::load(ta ? a[k * lda + m] : a[m * lda + k]) * E::load(tb ? b[n * ldb + k] : b[k * ldb + n]);
        float& c = C[m * ldc + n];
        c = beta == 0.0f ? s : s + beta * c;  // beta 0 never reads C (cuBLASLt's rule)
      }
  }
  float* as_f32(void* x, int64_t n, HostBuffer& holder) const {
    if constexpr (E::kType == DType::F32) {
      return static_cast<float*>(x);
    } else {
      holder = scratch(n, DType::F32);
      auto* f = static_cast<float*>(holder.data_ptr());
      for (int64_t i = 0; i < n; ++i) f[i] = E::load(static_cast<const S*>(x)[i]);
      return f;
    }
  }
  void narrow_back(void* x, const float* acc, int64_t n) const {
    if constexpr (E::kType != DType::F32)
      for (int64_t i = 0; i < n; ++i) static_cast<S*>(x)[i] = E::store(acc[i]);
  }
};

using paratrain::test::ConvCase;
using paratrain::test::expect_close;
using paratrain::test::expect_same_bits;
using paratrain::test::Tolerance;

// Values of dtype E (stored) from f32 ones, and back.
template <typename E>
std::vector<typename E::S> stored(const std::vector<float>& v) {
  std::vector<typename E::S> s(v.size());
  for (size_t i = 0; i < v.size(); ++i) s[i] = E::store(v[i]);
  return s;
}
template <typename E>
std::vector<float> values(const std::vector<typename E::S>& s) {
  std::vector<float> v(s.size());
  for (size_t i = 0; i < s.size(); ++i) v[i] = E::load(s[i]);
  return v;
}

const std::vector<ConvCase> kConvCases = {
    {3, 2, 7, 9, 5, 3, 1, 1, true},    // odd sizes, "same" padding
    {3, 3, 11, 6, 4, 5, 2, 2, true},   // stride 2, K 5
    {3, 3, 8, 10, 3, 2, 3, 0, false},  // stride above K (taps skip pixels), no bias
    {2, 1, 5, 5, 2, 5, 1, 0, true},    // one output pixel
    {3, 2, 4, 5, 3, 3, 2, 1, false},   // padding with stride 2
    {2, 4, 6, 6, 3, 1, 1, 0, true},    // 1x1
};

template <typename E>
void check_conv(const ConvCase& c, int64_t nb, Tolerance tol) {
  using S = typename E::S;
  constexpr DType t = E::kType;
  const conv::Geom g = conv::geometry(c.N, c.Ci, c.H, c.W, c.Co, c.K, c.stride, c.pad, "test");
  SCOPED_TRACE(std::string(paratrain::dtype_name(t)) + " " + c.name() + ", images per chunk " + std::to_string(nb));
  const size_t n_in = c.N * c.Ci * c.H * c.W, n_w = c.Co * g.rows(), n_out = c.N * c.Co * g.cols();
  const uint32_t seed = static_cast<uint32_t>(c.N * 1000 + c.Ci * 100 + c.K * 10 + c.stride);
  const auto inp = stored<E>(uniform(n_in, seed, -1, 1)), weight = stored<E>(uniform(n_w, seed + 1, -0.5f, 0.5f)),
             bias = stored<E>(uniform(c.Co, seed + 2, -1, 1)), dout = stored<E>(uniform(n_out, seed + 3, -1, 1));
  EmulatedOps<E> ops;

  std::vector<S> out_got(n_out), out_want(n_out);
  conv::forward_chunks<t>(ops, out_got.data(), inp.data(), weight.data(), c.bias ? bias.data() : nullptr, c.N, g, nb);
  registry().conv2d_forward.at(Device::CPU, t)(out_want.data(), inp.data(), weight.data(),
                                               c.bias ? bias.data() : nullptr, c.N, c.Ci, c.H, c.W, c.Co, c.K,
                                               c.stride, c.pad);
  expect_close(values<E>(out_got), values<E>(out_want), tol, "out");

  const auto base_in = stored<E>(uniform(n_in, seed + 4, -2, 2)), base_w = stored<E>(uniform(n_w, seed + 5, -2, 2)),
             base_b = stored<E>(uniform(c.Co, seed + 6, -2, 2));
  // bit 0 dinp, bit 1 dweight, bit 2 dbias; the bias gradient (one pass over all images, no
  // chunks) only with the real chunk size.
  const bool bias_grad = c.bias && nb == c.N;
  for (const int wanted : bias_grad ? std::vector<int>{7, 1, 2, 4} : std::vector<int>{3, 1, 2}) {
    SCOPED_TRACE("gradients wanted: " + std::to_string(wanted));
    std::vector<S> di = base_in, dw = base_w, db = base_b, di_want = base_in, dw_want = base_w, db_want = base_b;
    conv::backward_chunks<t>(ops, (wanted & 1) ? di.data() : nullptr, (wanted & 2) ? dw.data() : nullptr,
                             (wanted & 4) ? db.data() : nullptr, dout.data(), inp.data(), weight.data(), c.N, g, nb);
    registry().conv2d_backward.at(Device::CPU, t)((wanted & 1) ? di_want.data() : nullptr,
                                                  (wanted & 2) ? dw_want.data() : nullptr,
                                                  (wanted & 4) ? db_want.data() : nullptr, dout.data(), inp.data(),
                                                  weight.data(), c.N, c.Ci, c.H, c.W, c.Co, c.K, c.stride, c.pad);
    // f32: the increments; halves: the rounded totals. A gradient not wanted keeps its bits.
    const bool f32 = t == DType::F32;
    const auto bi = values<E>(base_in), bw = values<E>(base_w), bb = values<E>(base_b);
    if (wanted & 1) expect_close(values<E>(di), values<E>(di_want), tol, "dinp", f32 ? &bi : nullptr);
    else expect_same_bits(di, base_in, "dinp (not wanted)");
    if (wanted & 2) expect_close(values<E>(dw), values<E>(dw_want), tol, "dweight", f32 ? &bw : nullptr);
    else expect_same_bits(dw, base_w, "dweight (not wanted)");
    if (wanted & 4) expect_close(values<E>(db), values<E>(db_want), tol, "dbias", f32 ? &bb : nullptr);
    else expect_same_bits(db, base_b, "dbias (not wanted)");
  }
}

template <typename E>
void check_every_case(Tolerance tol) {
  for (const ConvCase& c : kConvCases) {
    const conv::Geom g = conv::geometry(c.N, c.Ci, c.H, c.W, c.Co, c.K, c.stride, c.pad, "test");
    ASSERT_EQ(conv::chunk_images(g, c.N), c.N) << "small cases fit one chunk";
    for (const int64_t nb : {c.N, int64_t{1}, int64_t{2}}) check_conv<E>(c, nb, tol);
  }
}

TEST(ConvEmulated, F32FollowsTheCpuInEveryChunking) { check_every_case<emulated::F32>({1e-5, 5e-5}); }
TEST(ConvEmulated, Bf16FollowsTheCpuInEveryChunking) { check_every_case<emulated::BF16>({1e-2, 2e-3}); }
TEST(ConvEmulated, F16FollowsTheCpuInEveryChunking) { check_every_case<emulated::F16>({2e-3, 2e-4}); }

TEST(ConvEmulated, ChunksHoldTheBudget) {
  // gpt-free sizes: the CNN's conv2 at batch 512 (per image max(288, 64) * 196 elements).
  const conv::Geom g = conv::geometry(512, 32, 14, 14, 64, 3, 1, 1, "test");
  const int64_t nb = conv::chunk_images(g, 512);
  EXPECT_EQ(nb, conv::kChunkBudget / (288 * 196));
  EXPECT_LE(nb * 288 * 196, conv::kChunkBudget);
  EXPECT_EQ(conv::chunk_images(g, 512, 1), 1) << "at least one image, whatever the budget";
}

template <typename E>
void check_maxpool() {
  using S = typename E::S;
  constexpr DType t = E::kType;
  struct PoolCase {
    int64_t N, C, H, W, K, stride, pad;
  };
  for (const PoolCase& c : std::vector<PoolCase>{{2, 3, 7, 9, 2, 2, 0}, {2, 2, 8, 8, 3, 2, 1}, {1, 2, 5, 6, 3, 1, 1}}) {
    SCOPED_TRACE(std::string(paratrain::dtype_name(t)) + " K" + std::to_string(c.K) + " s" + std::to_string(c.stride) +
                 " p" + std::to_string(c.pad));
    const int64_t Ho = paratrain::kernels::cpu::conv2d_out_size(c.H, c.K, c.stride, c.pad);
    const int64_t Wo = paratrain::kernels::cpu::conv2d_out_size(c.W, c.K, c.stride, c.pad);
    const size_t n_in = c.N * c.C * c.H * c.W, n_out = c.N * c.C * Ho * Wo;
    auto v = uniform(n_in, 11, -1, 1);
    for (size_t i = 0; i < n_in; i += 5) v[i] = 0.25f;  // ties
    v[3] = NAN, v[n_in - 2] = NAN;                       // NaN wins and stays the first
    const auto inp = stored<E>(v), dout = stored<E>(uniform(n_out, 12, -1, 1));
    std::vector<S> out(n_out), out_want(n_out);
    std::vector<int32_t> am(n_out), am_want(n_out);
    launch_serial(grid_for(n_out), 1, kThreads, [&] {
      conv::maxpool_forward_kernel<E>(out.data(), am.data(), inp.data(), c.N, c.C, c.H, c.W, c.K, c.stride, c.pad, Ho,
                                      Wo);
    });
    registry().maxpool2d_forward.at(Device::CPU, t)(out_want.data(), am_want.data(), inp.data(), c.N, c.C, c.H, c.W,
                                                    c.K, c.stride, c.pad);
    expect_same_bits(out, out_want, "out");
    expect_same_bits(am, am_want, "argmax");
    const auto base = stored<E>(uniform(n_in, 13, -1, 1));
    std::vector<S> d = base, d_want = base;
    EmulatedOps<E> ops;
    conv::maxpool_backward_steps<t>(ops, d.data(), dout.data(), am.data(), c.N * c.C, c.H * c.W, Ho * Wo);
    registry().maxpool2d_backward.at(Device::CPU, t)(d_want.data(), dout.data(), am_want.data(), c.N, c.C, c.H, c.W,
                                                     Ho, Wo);
    expect_same_bits(d, d_want, "dinp");
  }
}

TEST(ConvEmulated, MaxPoolIsTheCpusBitForBit) {
  check_maxpool<emulated::F32>();
  check_maxpool<emulated::BF16>();
  check_maxpool<emulated::F16>();
}

}  // namespace
