// Dense matrix multiplication through oneDNN (docs/dependencies.md says why oneDNN).
//
// Row-major, BLAS-like: C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T.
// op(A) is (M,K), op(B) is (K,N), C is (M,N). lda/ldb/ldc are row strides in elements of A,
// B, C as stored (A stored (M,K) when !trans_a, (K,M) when trans_a). beta = 0 ignores C's
// old contents (NaN included). Multi-threaded; single-threaded inside a parallel region.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

// A (M,K) or (K,M), B (K,N) or (N,K), C (M,N)
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);

// batch independent GEMMs; matrix i of X starts at X + i * stride_x (a stride may be 0 to
// share one matrix, e.g. a weight, across the batch). C matrices must not overlap.
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                  float* C, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
                  int64_t stride_c);

// Mixed precision: A and B are bf16 (uint16_t bit patterns), C and the accumulation f32.
// Same layout rules as gemm(). The operands are widened to f32 (exact) into reused
// thread-local scratch and the f32 GEMM runs: oneDNN 2.6 has no bf16 GEMM for CPUs without
// AVX512-BF16/AMX. The result equals gemm() on the bf16 values.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
               float* C, int64_t ldc);

void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
                       int64_t ldb, float beta, float* C, int64_t ldc, int64_t batch,
                       int64_t stride_a, int64_t stride_b, int64_t stride_c);

}  // namespace paratrain::kernels::cpu
