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
// after the launch and reused only by work queued after it on the compute stream. The kernel:
// orthogonalize_kernels.cuh.
#include "kernels/cuda/basic.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda::gs {
using detail::block_sum_double;
}  // namespace paratrain::kernels::cuda::gs

#include "kernels/cuda/orthogonalize_kernels.cuh"

namespace paratrain::kernels::cuda {

void orthogonalize_columns(void* P, int64_t n, int64_t r) {
  if (n < 0 || r < 0) PT_THROW(InputError, "orthogonalize_columns: negative size ", n, " x ", r);
  if (n == 0 || r == 0) return;
  const Tensor columns = Tensor::empty({n * r * static_cast<int64_t>(sizeof(double))}, DType::U8, Device::CUDA,
                                       ::paratrain::cuda::current_device());
  gs::gram_schmidt<<<1, gs::kThreads, 0, detail::stream()>>>(static_cast<float*>(P),
                                                             static_cast<double*>(columns.data_ptr()), n, r);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace paratrain::kernels::cuda
