// The CUDA cross-entropy kernels (kernels/cuda/crossentropy_kernels.cuh) run on the CPU over the
// emulation of the CUDA built-ins (tests/kernels/cuda_emulation.h: a block's 256 threads are
// host threads) with block_reduce.cuh's block_max and block_sum (warp shuffles, then the warps'
// results through shared memory), as crossentropy.cu, and its launch shape (a block of 256
// threads per row), against the CPU kernels (kernels/cpu/softmax.h) in f32, bf16 and f16:
// rows shorter than the block (most threads read nothing: their running max stays -inf and
// adds nothing) and longer (several passes, the running sums rescaled), -inf logits, rows ld >
// V apart whose padding holds NaN (never read: the losses stay finite; never written: its bits
// stay), an ignored target, the backward in place over the logits. lse and the losses within
// f32 summation-order error of the CPU's, dlogits within one rounding of the type. A target
// outside [0, V), which the CPU throws for, gives a NaN loss and a NaN row of dlogits. The GPU
// runs the same kernels (CudaLayerKernels.CrossEntropy*); this checks them without one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_emulation.h"
#include "kernels/emulated_elements.h"
#include "kernels/test_util.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/kernels/registry.h"

#include "kernels/cuda/block_reduce.cuh"

namespace paratrain::kernels::cuda::xent {
using detail::block_max;  // as crossentropy.cu
using detail::block_sum;
}  // namespace paratrain::kernels::cuda::xent

#include "kernels/cuda/crossentropy_kernels.cuh"

namespace {
using paratrain::Device;
using paratrain::kernels::registry;
using paratrain::kernels::cpu::testing::uniform;
namespace xent = paratrain::kernels::cuda::xent;
namespace emulated = paratrain::kernels::emulated;

template <typename S>
uint64_t bits(S v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(S));
  return b;
}

template <typename E>
void check_rows(int64_t V, int64_t ld) {
  using S = typename E::S;
  SCOPED_TRACE(std::string(paratrain::dtype_name(E::kType)) + " V=" + std::to_string(V) + " ld=" + std::to_string(ld));
  const int64_t N = 5;
  const auto vals = uniform(static_cast<size_t>(N * ld), 3, -4, 4);
  const std::vector<int32_t> targets = {0, static_cast<int32_t>(V - 1), paratrain::kernels::cpu::kIgnoreIndex,
                                        static_cast<int32_t>(V / 2), static_cast<int32_t>(V / 3)};
  std::vector<S> logits(vals.size());
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      float v = vals[r * ld + c];
      if (c >= V) {
        v = NAN;  // padding: never read
      } else if (r == 1 && c % 3 == 1 && c != targets[1]) {
        v = -INFINITY;  // -inf logits add nothing
      }
      logits[r * ld + c] = E::store(v);
    }

  std::vector<float> loss_want(N), lse_want(N), loss_got(N, -9), lse_got(N, -9);
  registry().crossentropy_forward.at(Device::CPU, E::kType)(loss_want.data(), lse_want.data(), logits.data(),
                                                             targets.data(), N, V, ld);
  launch(static_cast<unsigned>(N), 1, xent::kThreads, [&] {
    xent::forward_kernel<E>(loss_got.data(), lse_got.data(), logits.data(), targets.data(), V, ld);
  });
  for (int64_t r = 0; r < N; ++r) {
    EXPECT_NEAR(lse_got[r], lse_want[r], 2e-6 * (1 + std::fabs(lse_want[r]))) << "lse, row " << r;
    EXPECT_NEAR(loss_got[r], loss_want[r], 2e-6 * (1 + std::fabs(lse_want[r]))) << "loss, row " << r;
  }
  EXPECT_EQ(loss_got[2], 0.0f) << "the ignored row";

  // The backward from the CPU's lse, into a buffer whose padding holds a sentinel, and in place.
  const auto dl = uniform(static_cast<size_t>(N), 4, 0.1f, 2.0f);
  const S sentinel = E::store(-123.0f);
  std::vector<S> d_want(logits.size(), sentinel), d_got(logits.size(), sentinel);
  registry().crossentropy_backward.at(Device::CPU, E::kType)(d_want.data(), dl.data(), logits.data(),
                                                              lse_want.data(), targets.data(), N, V, ld);
  launch(static_cast<unsigned>(N), 1, xent::kThreads, [&] {
    xent::backward_kernel<E>(d_got.data(), dl.data(), logits.data(), lse_want.data(), targets.data(), V, ld);
  });
  std::vector<S> in_place = logits;
  launch(static_cast<unsigned>(N), 1, xent::kThreads, [&] {
    xent::backward_kernel<E>(in_place.data(), dl.data(), in_place.data(), lse_want.data(), targets.data(), V, ld);
  });
  // One rounding of the type (the exp's last f32 bit can flip it) and f32 error below that.
  const double ulp = E::kType == paratrain::DType::F32 ? 0x1p-21 : E::kType == paratrain::DType::BF16 ? 0x1p-8 : 0x1p-11;
  size_t bad = 0, bad_in_place = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const size_t i = static_cast<size_t>(r * ld + c);
      if (c >= V) {
        EXPECT_EQ(bits(d_got[i]), bits(sentinel)) << "padding written, row " << r << " column " << c;
        EXPECT_TRUE(std::isnan(E::load(in_place[i]))) << "in place: padding written, row " << r;
        continue;
      }
      const double want = E::load(d_want[i]), tol = ulp * std::fabs(want) + 1e-7;
      if (!(std::fabs(E::load(d_got[i]) - want) <= tol) && ++bad <= 3)
        ADD_FAILURE() << "dlogits row " << r << " column " << c << ": " << E::load(d_got[i]) << ", the CPU's " << want;
      if (!(std::fabs(E::load(in_place[i]) - want) <= tol)) ++bad_in_place;
    }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(bad_in_place, 0u) << "in place over the logits";
}

TEST(CrossEntropyEmulated, ForwardAndBackwardFollowTheCpu) {
  for (int64_t V : {50, 700}) {  // shorter than the block's 256 threads, and three passes of it
    check_rows<emulated::F32>(V, V);
    check_rows<emulated::F32>(V, V + 13);
    check_rows<emulated::BF16>(V, V + 6);
    check_rows<emulated::F16>(V, V + 6);
  }
}

TEST(CrossEntropyEmulated, ABadTargetIsANaNLossAndRow) {
  const int64_t V = 40;
  const auto logits = uniform(static_cast<size_t>(2 * V), 5, -1, 1);
  const std::vector<int32_t> targets = {static_cast<int32_t>(V), -7};
  std::vector<float> loss(2, 0), lse(2, 0), d(logits.size(), 0), dl(2, 1.0f);
  launch(2, 1, xent::kThreads, [&] {
    xent::forward_kernel<emulated::F32>(loss.data(), lse.data(), logits.data(), targets.data(), V, V);
  });
  EXPECT_TRUE(std::isnan(loss[0]) && std::isnan(loss[1]));
  EXPECT_TRUE(std::isfinite(lse[0]) && std::isfinite(lse[1])) << "lse does not depend on the target";
  launch(2, 1, xent::kThreads, [&] {
    xent::backward_kernel<emulated::F32>(d.data(), dl.data(), logits.data(), lse.data(), targets.data(), V, V);
  });
  for (float x : d) ASSERT_TRUE(std::isnan(x));
}

}  // namespace
