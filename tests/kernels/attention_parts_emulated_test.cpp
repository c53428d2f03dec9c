// The CUDA attention pieces' kernels (kernels/cuda/attention_parts_kernels.cuh) run on the CPU
// over the emulation of the CUDA built-ins they use (tests/kernels/cuda_emulation.h; kernels
// whose threads never wait for each other run serially), with the launch shapes that
// attention_parts.cu gives them (256 threads; a block per row, a warp per row for rowdot),
// against the CPU pieces (kernels/cpu/attention_parts.h): split and merge bit for bit in f32,
// bf16 and f16, P within f32 rounding of the CPU's exp, dS bit for bit, D within the rounding
// of another order of adding. Rows shorter and longer than the block's 256 threads, and a
// rowdot whose last block is partly past the rows. The GPU runs the same pieces on the device
// (CudaLayerKernels.AttentionPartsMatchCpu); this checks their indexing without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_emulation.h"
#include "kernels/emulated_elements.h"
#include "kernels/test_util.h"
#include "kernels/cuda/attention_parts_kernels.cuh"
#include "kernels/cuda/grid_stride.cuh"
#include "paratrain/kernels/cpu/attention_parts.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/dtype.h"
#include "support/expect_values.h"

namespace {
namespace cpu = paratrain::kernels::cpu;
namespace parts = paratrain::kernels::cuda::parts;
using paratrain::Device;
using paratrain::kernels::registry;
using paratrain::kernels::cpu::testing::uniform;

using paratrain::kernels::cuda::detail::kThreads;  // attention_parts.cu's block (grid_stride.cuh)

using paratrain::kernels::emulated::BF16;
using paratrain::kernels::emulated::F16;
using paratrain::kernels::emulated::F32;

using paratrain::test::expect_same_bits;

template <typename E>
void check_split_merge(int64_t B, int64_t T, int64_t NH, int64_t hs) {
  const int64_t C = NH * hs;
  for (int64_t P : {1, 3}) {
    SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                 " P=" + std::to_string(P));
    const auto xf = uniform(static_cast<size_t>(B * T * P * C), 7, -2, 2);
    std::vector<typename E::S> x(xf.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = E::store(xf[i]);
    std::vector<float> want(x.size(), -1.0f), got(x.size(), -1.0f);
    registry().attention_split_heads.at(Device::CPU, E::kType)(want.data(), x.data(), B, T, C, NH, P);
    launch_serial(static_cast<unsigned>(B * T), 1, kThreads, [&] {
      parts::split_rows_kernel<E>(got.data(), x.data(), B, T, int(C), int(NH), int(P));
    });
    expect_same_bits(got, want, "split");
    const auto heads = uniform(x.size(), 8, -1, 1);
    for (bool acc : {false, true}) {
      std::vector<typename E::S> y_want = x, y_got = x;
      registry().attention_merge_heads.at(Device::CPU, E::kType)(y_want.data(), heads.data(), B, T, C, NH, P, acc);
      launch_serial(static_cast<unsigned>(B * T), 1, kThreads, [&] {
        parts::merge_rows_kernel<E>(y_got.data(), heads.data(), B, T, int(C), int(NH), int(P), acc);
      });
      expect_same_bits(y_got, y_want, "merge, accumulate " + std::to_string(acc));
    }
  }
}

TEST(AttentionPartsEmulated, SplitAndMergeHeadsAreTheCpusBits) {
  // rows of P*C = 24 and 72 (under the block), 768 and 2304 (several passes of the block)
  check_split_merge<F32>(2, 21, 3, 8);
  check_split_merge<F32>(2, 5, 12, 64);
  check_split_merge<BF16>(2, 21, 3, 8);
  check_split_merge<BF16>(1, 5, 12, 64);
  check_split_merge<F16>(2, 21, 3, 8);
  check_split_merge<F16>(1, 5, 12, 64);
}

void check_chunk(int64_t BH, int64_t T, int64_t r0, int64_t rows) {
  SCOPED_TRACE("BH=" + std::to_string(BH) + " T=" + std::to_string(T) + " r0=" + std::to_string(r0) +
               " rows=" + std::to_string(rows));
  const int64_t keys = r0 + rows;
  const auto S = uniform(static_cast<size_t>(BH * rows * keys), 41, -3, 3);
  std::vector<float> soft = S, lse(static_cast<size_t>(BH * T), 0.0f);
  cpu::attention_chunk_softmax(soft.data(), lse.data(), BH, T, r0, rows);
  std::vector<float> want = S, got = S;
  cpu::attention_chunk_probs(want.data(), lse.data(), BH, T, r0, rows);
  launch_serial(static_cast<unsigned>(BH * rows), 1, kThreads,
         [&] { parts::chunk_probs_rows_kernel(got.data(), lse.data(), T, r0, rows); });
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if ((want[i] == 0.0f) != (got[i] == 0.0f)) ADD_FAILURE() << "probs: a masked score differs at " << i;
    worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / (1e-30 + std::fabs(double(want[i]))));
  }
  EXPECT_LT(worst, 4e-7) << "probs, relative";

  const auto dp0 = uniform(S.size(), 42, -1, 1), D = uniform(lse.size(), 43, -1, 1);
  std::vector<float> ds_want = dp0, ds_got = dp0;
  cpu::attention_chunk_dscores(ds_want.data(), want.data(), D.data(), BH, T, r0, rows);
  launch_serial(static_cast<unsigned>(BH * rows), 1, kThreads,
         [&] { parts::chunk_dscores_rows_kernel(ds_got.data(), want.data(), D.data(), T, r0, rows); });
  expect_same_bits(ds_got, ds_want, "dscores");
}

TEST(AttentionPartsEmulated, ChunkProbsAndDscoresFollowTheCpu) {
  check_chunk(6, 21, 7, 9);      // a middle chunk, rows shorter than the block
  check_chunk(2, 300, 0, 16);    // the first chunk
  check_chunk(2, 300, 256, 44);  // the last chunk: rows of 300 keys, past the block's 256
}

TEST(AttentionPartsEmulated, RowdotIsAWarpPerRow) {
  for (int64_t hs : {8, 64, 100}) {
    const int64_t BH = 3, T = 7, n = BH * T;  // 21 rows: the last block of 8 warps is part empty
    const auto a = uniform(static_cast<size_t>(n * hs), 44, -1, 1), b = uniform(a.size(), 45, -1, 1);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n + 3), -5.0f);
    cpu::attention_rowdot(want.data(), a.data(), b.data(), BH, T, hs);
    const unsigned warps = kThreads / 32;
    launch(static_cast<unsigned>((n + warps - 1) / warps), 1, kThreads,
           [&] { parts::rowdot_rows_kernel(got.data(), a.data(), b.data(), n, int(hs)); });
    for (int64_t r = 0; r < n; ++r) {
      double mag = 0;
      for (int64_t d = 0; d < hs; ++d) mag += std::fabs(double(a[r * hs + d]) * b[r * hs + d]);
      EXPECT_NEAR(got[r], want[r], 1e-6 * mag + 1e-30) << "row " << r << " hs " << hs;
    }
    for (int64_t r = n; r < n + 3; ++r) EXPECT_EQ(got[r], -5.0f) << "a row past the end was written";
  }
}

}  // namespace
