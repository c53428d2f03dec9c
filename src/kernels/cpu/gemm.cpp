// GEMM through oneDNN's dnnl_sgemm (row-major, OpenMP-threaded; it runs single-threaded when
// called inside a parallel region, which gemm_batched and attention rely on).
#include "paratrain/kernels/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/elementwise.h"

namespace paratrain::kernels::cpu {
namespace {

void check_dims(int64_t M, int64_t N, int64_t K) {
  if (M < 0 || N < 0 || K < 0)
    PT_THROW(InputError, "gemm: negative size M=", M, " N=", N, " K=", K);
}

// C = beta * C for the K == 0 case (beta == 0 writes zeros, ignoring NaN in C).
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    if (beta == 0.0f)
      for (int64_t j = 0; j < N; ++j) c[j] = 0.0f;
    else
      for (int64_t j = 0; j < N; ++j) c[j] *= beta;
  }
}

void sgemm_raw(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                beta, C, ldc);
  PT_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st), " (M=", M,
           " N=", N, " K=", K, " lda=", lda, " ldb=", ldb, " ldc=", ldc, ")");
}

void check_ld(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
              int64_t ldc) {
  int64_t min_lda = ta ? M : K, min_ldb = tb ? K : N;
  if (lda < std::max<int64_t>(1, min_lda) || ldb < std::max<int64_t>(1, min_ldb) ||
      ldc < std::max<int64_t>(1, N))
    PT_THROW(InputError, "gemm: leading dimension too small (lda=", lda, " ldb=", ldb,
             " ldc=", ldc, " for M=", M, " N=", N, " K=", K, ")");
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  check_dims(M, N, K);
  check_ld(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  detail::sync_omp_threads();
  sgemm_raw(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                  float* C, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
                  int64_t stride_c) {
  check_dims(M, N, K);
  if (batch < 0) PT_THROW(InputError, "gemm_batched: negative batch ", batch);
  check_ld(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  detail::sync_omp_threads();
  const int64_t flops = M * N * K;
  const int nt = detail::threads_for(batch, 1);
  // Big matrices: one threaded GEMM after another. Many small ones: threads over the batch,
  // each GEMM single-threaded.
  if (nt <= 1 || (flops >= (int64_t{1} << 22) && batch < 4 * nt)) {
    for (int64_t b = 0; b < batch; ++b)
      sgemm_raw(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb,
                beta, C + b * stride_c, ldc);
    return;
  }
  bool failed = false;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t b = 0; b < batch; ++b) {
    if (M == 0 || N == 0) continue;
    if (K == 0) {
      scale_c(M, N, beta, C + b * stride_c, ldc);
      continue;
    }
    dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                                  A + b * stride_a, lda, B + b * stride_b, ldb, beta,
                                  C + b * stride_c, ldc);
    if (st != dnnl_success) {
#pragma omp atomic write
      failed = true;
    }
  }
  PT_CHECK(!failed, "dnnl_sgemm failed in gemm_batched");
}

// bf16: this oneDNN (2.6) has no bf16 GEMM on CPUs without AVX512-BF16/AMX, which is the
// CPU class paratrain runs on, so the operands are widened to f32 (exact) into reused
// scratch and the f32 GEMM runs. The result equals an f32 GEMM of the bf16 values.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
  check_dims(M, N, K);
  check_ld(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  int64_t ra = trans_a ? K : M, rb = trans_b ? N : K;
  int64_t ca = trans_a ? M : K, cb = trans_b ? K : N;
  float* a = detail::scratch(4, static_cast<size_t>(ra * ca));
  float* b = detail::scratch(5, static_cast<size_t>(rb * cb));
  detail::parallel_for(ra, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) bf16_to_f32(a + r * ca, A + r * lda, ca);
  }, 1);
  detail::parallel_for(rb, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) bf16_to_f32(b + r * cb, B + r * ldb, cb);
  }, 1);
  gemm(trans_a, trans_b, M, N, K, alpha, a, std::max<int64_t>(1, ca), b,
       std::max<int64_t>(1, cb), beta, C, ldc);
}

void gemm_batched_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
                       int64_t ldb, float beta, float* C, int64_t ldc, int64_t batch,
                       int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  if (batch < 0) PT_THROW(InputError, "gemm_batched_bf16: negative batch ", batch);
  for (int64_t i = 0; i < batch; ++i)
    gemm_bf16(trans_a, trans_b, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb,
              beta, C + i * stride_c, ldc);
}

}  // namespace paratrain::kernels::cpu
