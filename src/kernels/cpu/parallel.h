// Private helpers of the CPU kernels: thread-count plumbing, parallel_for over index
// ranges, grow-only thread-local scratch buffers (no per-call malloc in steady state), and
// the thread-count-independent chunked sum of the reductions.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "paratrain/base/error.h"
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
// the same thread asks for a larger buffer in the same slot. Slots [0, kHalfScratchBase) are
// the f32 kernels'; the half-type kernels use the rest (half_util.h's half_scratch), since
// they hold theirs while the f32 kernels they call use the first ones.
constexpr int kHalfScratchBase = 6;
constexpr int kScratchSlots = 12;
float* scratch(int slot, size_t n);

// The sum over [0, n) of chunk_sum(begin, end) (a double) over fixed chunks of kReduceChunk
// elements, the chunks in parallel and combined in order: the result does not depend on the
// thread count. InputError for n < 0.
constexpr int64_t kReduceChunk = 1 << 14;
template <typename F>
double chunked_sum(int64_t n, F&& chunk_sum) {
  if (n < 0) PT_THROW(InputError, "reduce: negative element count ", n);
  const int64_t nchunks = (n + kReduceChunk - 1) / kReduceChunk;
  thread_local std::vector<double> partial;
  if (static_cast<int64_t>(partial.size()) < nchunks) partial.resize(nchunks);
  double* p = partial.data();
  parallel_for(nchunks, 4, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) p[c] = chunk_sum(c * kReduceChunk, std::min(n, (c + 1) * kReduceChunk));
  }, 1);
  double s = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) s += p[c];
  return s;
}

}  // namespace paratrain::kernels::cpu::detail
