// Helpers on the flat f32 buffers that data-parallel wrappers reduce: internal to the parallel
// layer (DistributedDataParallel's buckets, FullyShardedDataParallel's units).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/comm/work.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/tensor.h"

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

// Makes a GPU tensor's device the thread's current one for a scope (the dispatch-table kernels
// run on the current device's compute stream); nothing for a CPU tensor.
class OnDeviceOf {
 public:
  explicit OnDeviceOf(const Tensor& t) {
    if (t.is_cuda() && cuda::current_device() != t.device_index()) {
      prev_ = cuda::current_device();
      cuda::set_device(t.device_index());
    }
  }
  ~OnDeviceOf() {
    if (prev_ >= 0) cuda::set_device(prev_);
  }
  OnDeviceOf(const OnDeviceOf&) = delete;
  OnDeviceOf& operator=(const OnDeviceOf&) = delete;

 private:
  int prev_ = -1;
};

// The same on contiguous f32 tensors of one device: the host loops above on the CPU (the
// same bits as ever), the dispatch-table kernels (add, scale) and zero_() on a GPU, queued on
// its compute stream.
inline void move_add(const Tensor& acc, const Tensor& g) {
  if (!acc.is_cuda()) return move_add(acc.data<float>(), g.data<float>(), acc.numel());
  const OnDeviceOf on(acc);
  kernels::kernel(&kernels::Registry::add, acc)(acc.data_ptr(), acc.data_ptr(), g.data_ptr(), acc.numel());
  Tensor(g).zero_();
}

inline void scale(const Tensor& t, float s) {
  if (!t.is_cuda()) return scale(t.data<float>(), t.numel(), s);
  const OnDeviceOf on(t);
  kernels::kernel(&kernels::Registry::scale, t)(t.data_ptr(), t.data_ptr(), s, t.numel());
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

// As wait_work, for a call whose result is next read on the compute stream of `device`'s GPU:
// there (nccl) the compute stream waits for it on the GPU and the host goes on
// (Work::wait_on_device); for host buffers it is wait_work. A failure after it returned shows
// at a later wait()/error() and in the group's later calls.
inline void wait_work_on(const comm::WorkPtr& w, double timeout_s, bool device) {
  if (!w) return;
  if (!device) return wait_work(w, timeout_s);
  w->wait_on_device(std::chrono::milliseconds(timeout_s > 0 ? static_cast<int64_t>(timeout_s * 1000) : 0));
}

// "a, b, c and 7 more": at most `most` names, for messages about parameters.
inline std::string name_list(const std::vector<std::string>& names, size_t most = 10) {
  std::string out;
  for (size_t j = 0; j < names.size() && j < most; ++j) out += (j ? ", " : "") + names[j];
  if (names.size() > most) out += " and " + std::to_string(names.size() - most) + " more";
  return out;
}

}  // namespace paratrain::parallel::detail
