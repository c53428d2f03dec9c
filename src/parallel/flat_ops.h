// Helpers on the flat f32 buffers that data-parallel wrappers reduce: internal to the parallel
// layer (DistributedDataParallel's buckets, FullyShardedDataParallel's units).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/comm/work.h"

namespace paratrain::parallel::detail {

// A parameter at [offset, offset + numel) of a flat buffer whose block `rank` is
// [rank * block, (rank + 1) * block): the owned elements as `begin` (in the parameter),
// `count` and `at` (in the block); count 0 when it owns none.
struct OwnedRange {
  int64_t begin = 0, count = 0, at = 0;
};

inline OwnedRange owned_range(int64_t offset, int64_t numel, int rank, int64_t block) {
  const int64_t lo_r = rank * block, hi_r = lo_r + block;
  const int64_t lo = std::max(offset, lo_r), hi = std::min(offset + numel, hi_r);
  if (lo >= hi) return {};
  return {lo - offset, hi - lo, lo - lo_r};
}

// acc += g; g = 0 (contiguous f32, n elements). Elementwise, so the thread split does not
// change a single bit.
inline void move_add(float* acc, float* g, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    acc[i] += g[i];
    g[i] = 0.0f;
  }
}

inline void scale(float* p, int64_t n, float s) {
#pragma omp parallel for simd if (n > (1 << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

using Clock = std::chrono::steady_clock;
inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Waits with the wrapper's deadline (0: the group's own per-call deadline).
inline void wait_work(const comm::WorkPtr& w, double timeout_s) {
  if (!w) return;
  w->wait(std::chrono::milliseconds(timeout_s > 0 ? static_cast<int64_t>(timeout_s * 1000) : 0));
}

// "a, b, c and 7 more": at most `most` names, for messages about parameters.
inline std::string name_list(const std::vector<std::string>& names, size_t most = 10) {
  std::string out;
  for (size_t j = 0; j < names.size() && j < most; ++j) out += (j ? ", " : "") + names[j];
  if (names.size() > most) out += " and " + std::to_string(names.size() - most) + " more";
  return out;
}

}  // namespace paratrain::parallel::detail
