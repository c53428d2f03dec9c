// The kernel of the CUDA Gram-Schmidt (orthogonalize.cu; the rules: kernels/cpu/orthogonalize.h):
// one block of kThreads threads per call, thread t owning rows t, t + kThreads, ... of every
// column for the whole call, the columns in double scratch c (column-major, n x r), so that
// only the dot products and norms cross threads: block sums in one fixed tree, in double
// (block_sum_double<kThreads>, the includer's, in this namespace). Two projection passes per
// column; a column that projects to exactly zero stays zero.
//
// This file holds only the kernel, so that it compiles on the host over an emulation of the
// CUDA built-ins it uses (threadIdx) and of the block sum, as
// tests/kernels/orthogonalize_emulated_test.cpp does, to check it without a GPU.
#pragma once

#include <cmath>
#include <cstdint>

namespace paratrain::kernels::cuda::gs {
namespace {

constexpr int kThreads = 512;

__global__ void gram_schmidt(float* P, double* c, int64_t n, int64_t r) {
  const int64_t t = threadIdx.x;
  for (int64_t i = t; i < n; i += kThreads)
    for (int64_t k = 0; k < r; ++k) c[k * n + i] = P[i * r + k];
  for (int64_t k = 0; k < r; ++k) {
    double* ck = c + k * n;
    for (int pass = 0; pass < 2 && k > 0; ++pass)
      for (int64_t j = 0; j < k; ++j) {
        const double* cj = c + j * n;
        double part = 0;
        for (int64_t i = t; i < n; i += kThreads) part += cj[i] * ck[i];
        const double d = block_sum_double<kThreads>(part);
        for (int64_t i = t; i < n; i += kThreads) ck[i] -= d * cj[i];
      }
    double part = 0;
    for (int64_t i = t; i < n; i += kThreads) part += ck[i] * ck[i];
    const double norm = sqrt(block_sum_double<kThreads>(part));
    const double inv = norm == 0 ? 0.0 : 1.0 / norm;
    for (int64_t i = t; i < n; i += kThreads) ck[i] *= inv;
  }
  for (int64_t i = t; i < n; i += kThreads)
    for (int64_t k = 0; k < r; ++k) P[i * r + k] = static_cast<float>(c[k * n + i]);
}

}  // namespace
}  // namespace paratrain::kernels::cuda::gs
