// Private helpers of the CPU kernels: thread-count plumbing, parallel_for over index
// ranges, and grow-only thread-local scratch buffers (no per-call malloc in steady state).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "paratrain/kernels/cpu/threads.h"

namespace paratrain::kernels::cpu::detail {

// Makes the calling thread's OpenMP ICV equal the kernels' thread count, so that oneDNN
// (which reads omp_get_max_threads()) uses it too.
void sync_omp_threads();

// Threads to use for `work` units when each thread should get at least `grain` of them;
// 1 inside a parallel region.
inline int threads_for(int64_t work, int64_t grain) {
  if (omp_in_parallel()) return 1;
  int64_t by_work = grain > 0 ? work / grain : work;
  int64_t nt = std::min<int64_t>(num_threads(), std::max<int64_t>(1, by_work));
  return static_cast<int>(nt);
}

// Calls f(begin, end) on contiguous chunks of [0, n), chunk borders multiples of `align`.
// f must not throw.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f, int64_t align = 16) {
  if (n <= 0) return;
  int nt = threads_for(n, grain);
  if (nt <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int64_t k = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t per = (n + k - 1) / k;
    per = (per + align - 1) / align * align;
    int64_t b = std::min(n, t * per), e = std::min(n, b + per);
    if (b < e) f(b, e);
  }
}

// Calls f(i) for i in [0, n) with dynamic scheduling (uneven tasks). f must not throw.
template <typename F>
void parallel_tasks(int64_t n, F&& f) {
  if (n <= 0) return;
  int nt = threads_for(n, 1);
  if (nt <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Thread-local grow-only scratch: slot in [0, kScratchSlots). The pointer stays valid until
// the same thread asks for a larger buffer in the same slot.
constexpr int kScratchSlots = 6;
float* scratch(int slot, size_t n);

}  // namespace paratrain::kernels::cpu::detail
