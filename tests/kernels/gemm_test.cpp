#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::randn;

// C = alpha op(A) op(B) + beta C in double
std::vector<float> ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                            const std::vector<float>& A, int64_t lda, const std::vector<float>& B,
                            int64_t ldb, float beta, std::vector<float> C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double a = ta ? A[k * lda + i] : A[i * lda + k];
        double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      C[i * ldc + j] = static_cast<float>(alpha * s + (beta == 0.0f ? 0.0 : beta * C[i * ldc + j]));
    }
  return C;
}

TEST(Gemm, AllTransposesOddSizesAndPaddedStrides) {
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {64, 48, 96}, {3, 100, 1}};
  for (auto& s : sizes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t M = s[0], N = s[1], K = s[2];
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
        auto A = randn((ta ? K : M) * lda, 1), B = randn((tb ? N : K) * ldb, 2);
        auto C = randn(M * ldc, 3);
        auto want = ref_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C, ldc);
        gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), ldc);
        EXPECT_TRUE(all_close(C, want, 1e-4, 1e-4)) << M << "x" << N << "x" << K << " ta=" << ta << " tb=" << tb;
      }
}

TEST(Gemm, BetaZeroIgnoresNanAndKZero) {
  std::vector<float> A = {1, 2}, B = {3, 4}, C = {NAN};
  gemm(false, false, 1, 1, 2, 1.0f, A.data(), 2, B.data(), 1, 0.0f, C.data(), 1);
  EXPECT_FLOAT_EQ(C[0], 11.0f);
  C = {NAN, NAN};
  gemm(false, false, 1, 2, 0, 1.0f, A.data(), 1, B.data(), 2, 0.0f, C.data(), 2);
  EXPECT_EQ(C[0], 0.0f);
  EXPECT_THROW(gemm(false, false, -1, 1, 1, 1.0f, A.data(), 1, B.data(), 1, 0.0f, C.data(), 1),
               InputError);
}

TEST(Gemm, BatchedWithSharedOperand) {
  const int64_t M = 9, N = 11, K = 6, batch = 5;
  auto A = randn(M * K, 4);  // shared (stride 0)
  auto B = randn(batch * K * N, 5);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> C(batch * M * N, 1.0f);
    gemm_batched(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 1.0f, C.data(), N, batch,
                 0, K * N, M * N);
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<float> Bb(B.begin() + b * K * N, B.begin() + (b + 1) * K * N);
      auto want = ref_gemm(false, false, M, N, K, 1.0f, A, K, Bb, N, 1.0f, std::vector<float>(M * N, 1.0f), N);
      std::vector<float> got(C.begin() + b * M * N, C.begin() + (b + 1) * M * N);
      EXPECT_TRUE(all_close(got, want, 1e-4, 1e-4)) << "batch " << b;
    }
  }
  set_num_threads(2);
}

TEST(Gemm, Bf16MatchesF32OfRoundedInputs) {
  const int64_t M = 17, N = 23, K = 31;
  auto A = randn(K * M, 6), B = randn(N * K, 7);
  std::vector<uint16_t> Ab(A.size()), Bb(B.size());
  for (size_t i = 0; i < A.size(); ++i) { Ab[i] = paratrain::f32_to_bf16(A[i]); A[i] = paratrain::bf16_to_f32(Ab[i]); }
  for (size_t i = 0; i < B.size(); ++i) { Bb[i] = paratrain::f32_to_bf16(B[i]); B[i] = paratrain::bf16_to_f32(Bb[i]); }
  std::vector<float> C(M * N, 0.0f);
  gemm_bf16(true, true, M, N, K, 1.0f, Ab.data(), M, Bb.data(), K, 0.0f, C.data(), N);
  auto want = ref_gemm(true, true, M, N, K, 1.0f, A, M, B, K, 0.0f, std::vector<float>(M * N), N);
  EXPECT_TRUE(all_close(C, want, 1e-4, 1e-4));
  std::vector<float> C2(2 * M * N, 0.0f);
  std::vector<uint16_t> A2(Ab), B2;
  A2.insert(A2.end(), Ab.begin(), Ab.end());
  gemm_batched_bf16(true, true, M, N, K, 1.0f, A2.data(), M, Bb.data(), K, 0.0f, C2.data(), N, 2,
                    K * M, 0, M * N);
  std::vector<float> second(C2.begin() + M * N, C2.end());
  EXPECT_TRUE(all_close(second, want, 1e-4, 1e-4));
}

TEST(Threads, SetAndGet) {
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
  EXPECT_THROW(set_num_threads(0), InputError);
}

}  // namespace
}  // namespace paratrain::kernels::cpu
