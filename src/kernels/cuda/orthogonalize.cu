// Gram-Schmidt on the columns of P on the GPU (kernels/cuda/basic.h; the rules of
// kernels/cpu/orthogonalize.h): PowerSGD's P between its two all-reduces, with no host sync.
//
// One block of kThreads threads per call: P is tall and thin (n rows, r <= a few dozen
// columns), so the work (about 5 n r^2 flops) is small next to the GEMMs around it, and one
// block needs no grid-wide barrier between the dependent column steps. Thread t owns rows
// t, t + kThreads, ... of every column for the whole call, so only the dot products and
// norms (block sums in a fixed tree, in double) cross threads. The columns are kept in a
// per-device double scratch (column-major, grow-only, used in compute-stream order), as the
// CPU keeps them in double between steps.
#include "kernels/cuda/basic.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"

namespace paratrain::kernels::cuda {
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
        const double d = detail::block_sum_double<kThreads>(part);
        for (int64_t i = t; i < n; i += kThreads) ck[i] -= d * cj[i];
      }
    double part = 0;
    for (int64_t i = t; i < n; i += kThreads) part += ck[i] * ck[i];
    const double norm = sqrt(detail::block_sum_double<kThreads>(part));
    const double inv = norm == 0 ? 0.0 : 1.0 / norm;
    for (int64_t i = t; i < n; i += kThreads) ck[i] *= inv;
  }
  for (int64_t i = t; i < n; i += kThreads)
    for (int64_t k = 0; k < r; ++k) P[i * r + k] = static_cast<float>(c[k * n + i]);
}

// The double columns of the current device, grown when a larger P comes (cudaFree waits for
// the kernels still using the old buffer).
struct Scratch {
  std::mutex mu;
  double* data = nullptr;
  int64_t capacity = 0;
};

}  // namespace

void orthogonalize_columns(void* P, int64_t n, int64_t r) {
  if (n < 0 || r < 0) PT_THROW(InputError, "orthogonalize_columns: negative size ", n, " x ", r);
  if (n == 0 || r == 0) return;
  Scratch& s = detail::per_device<Scratch>();
  std::lock_guard<std::mutex> lock(s.mu);  // enqueue under the lock: one size per launch
  if (s.capacity < n * r) {
    if (s.data) PT_CUDA_CHECK(cudaFree(s.data));
    s.data = nullptr;
    PT_CUDA_CHECK(cudaMalloc(&s.data, static_cast<size_t>(n * r) * sizeof(double)));
    s.capacity = n * r;
  }
  gram_schmidt<<<1, kThreads, 0, detail::stream()>>>(static_cast<float*>(P), s.data, n, r);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace paratrain::kernels::cuda
