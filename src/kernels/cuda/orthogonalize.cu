// Gram-Schmidt on the columns of P on the GPU (kernels/cuda/basic.h; the rules of
// kernels/cpu/orthogonalize.h): PowerSGD's P between its two all-reduces, with no host sync.
//
// One block of kThreads threads per call: P is tall and thin (n rows, r <= a few dozen
// columns), so the work (about 5 n r^2 flops) is small next to the GEMMs around it, and one
// block needs no grid-wide barrier between the dependent column steps. Thread t owns rows
// t, t + kThreads, ... of every column for the whole call, so only the dot products and
// norms (block sums in a fixed tree, in double) cross threads. The columns are kept in
// double scratch memory (column-major), as the CPU keeps them in double between steps: a
// block of the device's caching allocator, so it counts in the device's memory figures, freed
// after the launch and reused only by work queued after it on the compute stream.
#include "kernels/cuda/basic.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "paratrain/tensor/tensor.h"

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

}  // namespace

void orthogonalize_columns(void* P, int64_t n, int64_t r) {
  if (n < 0 || r < 0) PT_THROW(InputError, "orthogonalize_columns: negative size ", n, " x ", r);
  if (n == 0 || r == 0) return;
  const Tensor columns = Tensor::empty({n * r * static_cast<int64_t>(sizeof(double))}, DType::U8, Device::CUDA,
                                       ::paratrain::cuda::current_device());
  gram_schmidt<<<1, kThreads, 0, detail::stream()>>>(static_cast<float*>(P), static_cast<double*>(columns.data_ptr()),
                                                     n, r);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace paratrain::kernels::cuda
