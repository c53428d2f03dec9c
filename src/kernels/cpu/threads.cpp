#include "paratrain/kernels/cpu/threads.h"

#include <omp.h>

#include <atomic>

#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu {
namespace {
std::atomic<int> g_threads{0};
int current() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    int d = omp_get_max_threads();
    int expected = 0;
    g_threads.compare_exchange_strong(expected, d < 1 ? 1 : d);
    n = g_threads.load(std::memory_order_relaxed);
  }
  return n;
}
}  // namespace

void set_num_threads(int n) {
  if (n < 1) PT_THROW(InputError, "kernels: thread count must be >= 1, got ", n);
  g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
}

int num_threads() { return current(); }

namespace detail {
void sync_omp_threads() {
  thread_local int applied = -1;
  int n = current();
  if (applied != n) {
    omp_set_num_threads(n);
    applied = n;
  }
}

float* scratch(int slot, size_t n) {
  PT_CHECK(slot >= 0 && slot < kScratchSlots, "bad scratch slot ", slot);
  thread_local std::vector<float> bufs[kScratchSlots];
  auto& b = bufs[slot];
  if (b.size() < n) {
    b.clear();
    b.shrink_to_fit();
    b.resize(n + 64);
  }
  return b.data();
}
}  // namespace detail

}  // namespace paratrain::kernels::cpu
