// The CUDA LayerNorm kernels (kernels/cuda/layernorm_kernels.cuh) run on the CPU over the
// emulation of the CUDA built-ins (tests/kernels/cuda_emulation.h: a block's threads are host
// threads, a warp's shuffles an exchange among its 32 lanes) with block_reduce.cuh's warp_sum,
// as layernorm.cu, and with its launch shapes
// (a warp per row, 8 rows a block; the parameter sums in blocks of 32 columns x 8 over chunks of
// rows, then the chunks added in order), against the CPU kernels (kernels/cpu/layernorm.h):
// row counts that leave the last block's warps without a row, rows shorter and longer than a
// warp, several chunks, the backward's += into prefilled gradients, no affine parameters, and
// the same bits on a second run (no atomics). The forward's mean, rstd and output and the
// gradients within f32 summation-order error of the CPU's. The GPU runs the same kernels
// (CudaLayerKernels.LayerNormMatchesCpu); this checks them without one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_emulation.h"
#include "kernels/test_util.h"
#include "paratrain/kernels/cpu/layernorm.h"

#include "kernels/cuda/block_reduce.cuh"

namespace paratrain::kernels::cuda::ln {
using detail::warp_sum;  // as layernorm.cu
}  // namespace paratrain::kernels::cuda::ln

#include "kernels/cuda/layernorm_kernels.cuh"

namespace {
namespace cpu = paratrain::kernels::cpu;
namespace ln = paratrain::kernels::cuda::ln;
using cpu::testing::uniform;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double m = 0;
  for (float w : want) m = std::max(m, std::fabs(double(w)));
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= tol * (std::fabs(double(want[i])) + m)) && ++bad <= 3)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << ", the CPU's " << want[i];
  EXPECT_EQ(bad, 0u) << what;
}

struct Grads {
  std::vector<float> dinp, dweight, dbias;
};

// layernorm.cu's backward: dinp by rows, then the parameter sums over chunks of rows_per_chunk.
Grads gpu_backward(const Grads& start, const std::vector<float>& dout, const std::vector<float>& x,
                   const float* weight, const std::vector<float>& mean, const std::vector<float>& rstd, int64_t N,
                   int64_t C, int64_t rows_per_chunk) {
  Grads g = start;
  const unsigned row_blocks = static_cast<unsigned>((N + ln::kRowsPerBlock - 1) / ln::kRowsPerBlock);
  launch(row_blocks, 1, ln::kThreads, [&] {
    ln::layernorm_backward_dinp_kernel(g.dinp.data(), dout.data(), x.data(), weight, mean.data(), rstd.data(), N, C);
  });
  const int64_t chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<float> partial(static_cast<size_t>(chunks * 2 * C), NAN);
  launch(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks), Dim{32, 8, 1}, [&] {
    ln::layernorm_backward_params_kernel(partial.data(), dout.data(), x.data(), mean.data(), rstd.data(), N, C,
                                         rows_per_chunk);
  });
  launch_serial(static_cast<unsigned>((C + 255) / 256), 1, 256, [&] {
    ln::add_chunks_in_order(g.dweight.data(), g.dbias.data(), partial.data(), chunks, C);
  });
  return g;
}

void check(int64_t N, int64_t C, bool affine, int64_t rows_per_chunk) {
  SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + (affine ? " affine" : " no affine") +
               " rows per chunk " + std::to_string(rows_per_chunk));
  const auto x = uniform(static_cast<size_t>(N * C), 11, -3, 5), w = uniform(static_cast<size_t>(C), 12, 0.5f, 1.5f),
             b = uniform(static_cast<size_t>(C), 13, -1, 1), dout = uniform(x.size(), 14, -1, 1);
  const float* weight = affine ? w.data() : nullptr;
  const float* bias = affine ? b.data() : nullptr;
  std::vector<float> out_w(x.size()), mean_w(N), rstd_w(N);
  cpu::layernorm_forward(out_w.data(), mean_w.data(), rstd_w.data(), x.data(), weight, bias, N, C);
  std::vector<float> out(x.size(), NAN), mean(N, NAN), rstd(N, NAN);
  const unsigned row_blocks = static_cast<unsigned>((N + ln::kRowsPerBlock - 1) / ln::kRowsPerBlock);
  launch(row_blocks, 1, ln::kThreads, [&] {
    ln::layernorm_forward_kernel(out.data(), mean.data(), rstd.data(), x.data(), weight, bias, N, C,
                                 cpu::kLayerNormEps);
  });
  expect_close(mean, mean_w, 1e-6, "mean");
  expect_close(rstd, rstd_w, 1e-6, "rstd");
  expect_close(out, out_w, 2e-6, "out");

  const Grads start{uniform(x.size(), 15, -0.1f, 0.1f), uniform(w.size(), 16, -0.1f, 0.1f),
                    uniform(b.size(), 17, -0.1f, 0.1f)};
  Grads want = start;
  cpu::layernorm_backward(want.dinp.data(), want.dweight.data(), want.dbias.data(), dout.data(), x.data(), weight,
                          mean_w.data(), rstd_w.data(), N, C);
  const Grads got = gpu_backward(start, dout, x, weight, mean_w, rstd_w, N, C, rows_per_chunk);
  expect_close(got.dinp, want.dinp, 2e-6, "dinp");
  expect_close(got.dweight, want.dweight, 2e-6, "dweight");
  expect_close(got.dbias, want.dbias, 2e-6, "dbias");
  const Grads again = gpu_backward(start, dout, x, weight, mean_w, rstd_w, N, C, rows_per_chunk);
  EXPECT_EQ(again.dweight, got.dweight) << "the same bits every run";
  EXPECT_EQ(again.dbias, got.dbias) << "the same bits every run";
}

TEST(LayerNormEmulated, ForwardAndBackwardFollowTheCpu) {
  check(13, 20, true, 256);   // 13 rows: the second block's last 3 warps have none; a row shorter than a warp
  check(21, 75, true, 5);     // 5 chunks, the last one short; columns past a block of 32
  check(16, 300, false, 16);  // no affine parameters; a row of several passes
}

}  // namespace
