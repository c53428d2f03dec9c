// Thread count of the CPU kernels.
//
// One OpenMP pool serves the kernels and oneDNN's GEMM. The count is process-wide: every
// kernel (and every GEMM, whichever thread calls it) uses num_threads() threads. The
// default is omp_get_max_threads() at start-up (OMP_NUM_THREADS when set).
#pragma once

namespace paratrain::kernels::cpu {

// Sets the number of threads the kernels use; n >= 1 (InputError otherwise).
void set_num_threads(int n);
// The number of threads the kernels use.
int num_threads();

}  // namespace paratrain::kernels::cpu
