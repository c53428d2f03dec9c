// The CUDA Gram-Schmidt kernel (kernels/cuda/orthogonalize_kernels.cuh, PowerSGD's P on a GPU)
// runs on the CPU over the emulation of the CUDA built-ins (tests/kernels/cuda_emulation.h: its
// block's 512 threads are host threads) with block_reduce.cuh's block_sum_double (a fixed tree
// over shared memory, with its barriers), as orthogonalize.cu, and its launch (one block), against
// the CPU kernel (kernels/cpu/orthogonalize.h): sizes around the block's 512 rows a pass, a zero
// column kept zero, a nearly dependent column (column 0 plus 1e-3 noise) that the second pass
// orthogonalises; the columns within 1e-6 of the CPU's and orthonormal. The GPU runs the same
// kernel (CudaBasicKernels.OrthogonalizeColumns); this checks it without one. Dividing the zero
// column by its zero norm (NaN) fails it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_emulation.h"
#include "kernels/test_util.h"
#include "paratrain/kernels/cpu/orthogonalize.h"
#include "support/expect_values.h"

#include "kernels/cuda/block_reduce.cuh"

namespace paratrain::kernels::cuda::gs {
using detail::block_sum_double;  // as orthogonalize.cu
}  // namespace paratrain::kernels::cuda::gs

#include "kernels/cuda/orthogonalize_kernels.cuh"

namespace {
namespace gs = paratrain::kernels::cuda::gs;
using paratrain::kernels::cpu::testing::uniform;

TEST(OrthogonalizeEmulated, ColumnsAreTheCpusAndOrthonormal) {
  for (const int64_t n : std::vector<int64_t>{1, 7, 511, 512, 1000}) {
    for (const int64_t r : std::vector<int64_t>{1, 4, 5}) {
      if (r > n) continue;  // more columns than rows cannot all be orthonormal (PowerSGD never asks)
      const std::string tag = "n=" + std::to_string(n) + " r=" + std::to_string(r);
      std::vector<float> P = uniform(static_cast<size_t>(n * r), static_cast<uint32_t>(7 * n + r), -1, 1);
      const bool special = r >= 4 && n >= 5;
      if (special) {
        const auto noise = uniform(static_cast<size_t>(n), 3, -1, 1);
        for (int64_t i = 0; i < n; ++i) {
          P[i * r + 2] = 0.0f;                           // stays zero
          P[i * r + 3] = P[i * r] + 1e-3f * noise[i];    // nearly column 0
        }
      }
      std::vector<float> want = P, got = P;
      paratrain::kernels::cpu::orthogonalize_columns(want.data(), n, r);
      std::vector<double> columns(static_cast<size_t>(n * r), std::nan(""));  // the kernel's scratch
      launch(1, 1, gs::kThreads, [&] { gs::gram_schmidt(got.data(), columns.data(), n, r); });
      paratrain::test::expect_close(got, want, {1e-6, 1e-9}, "columns " + tag);
      for (int64_t a = 0; a < r; ++a)
        for (int64_t b = 0; b <= a; ++b) {
          double d = 0;
          for (int64_t i = 0; i < n; ++i) d += static_cast<double>(got[i * r + a]) * got[i * r + b];
          const bool zero = special && (a == 2 || b == 2);
          EXPECT_NEAR(d, zero ? 0.0 : a == b ? 1.0 : 0.0, 1e-5) << "column " << a << " . column " << b << ", " << tag;
        }
    }
  }
}

}  // namespace
