#include "paratrain/kernels/cpu/peak.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include <immintrin.h>

#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/gemm.h"
#include "paratrain/kernels/cpu/threads.h"

namespace paratrain::kernels::cpu {
namespace {

using Clock = std::chrono::steady_clock;

// kChains independent accumulators: enough to cover FMA latency (4-5 cycles) times the FMA
// units per core (2 on current x86 cores) so the loop is throughput-bound, not latency-bound.
constexpr int kChains = 12;

// Each burst function runs `n` iterations of kChains FMAs and returns a value derived from
// every accumulator, so the compiler cannot drop any of them.
__attribute__((target("avx512f"))) float burst_avx512(long n) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < n; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  alignas(64) float v[16];
  _mm512_store_ps(v, s);
  float t = 0;
  for (float x : v) t += x;
  return t;
}

__attribute__((target("avx2,fma"))) float burst_avx2(long n) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < n; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  float t = 0;
  for (float x : v) t += x;
  return t;
}

float burst_scalar(long n) {
  volatile float seed = 0.999999f;  // keeps the loop from being folded at compile time
  float acc[kChains];
  const float a = seed, b = 1e-7f;
  for (int c = 0; c < kChains; ++c) acc[c] = 0.001f * c;
  for (long i = 0; i < n; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;
  float s = 0;
  for (float x : acc) s += x;
  return s;
}

struct Isa {
  const char* name;
  int lanes;
  float (*burst)(long);
};

Isa pick_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {"avx512f", 16, burst_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"avx2+fma", 8, burst_avx2};
  return {"scalar", 1, burst_scalar};
}

// The fastest burst of this thread, in FLOP/s.
double best_burst_rate(const Isa& isa, int bursts, long n, float* sink) {
  double best = 0;
  const double flops = 2.0 * isa.lanes * kChains * static_cast<double>(n);
  float sum = isa.burst(n / 4 + 1);  // warm-up: wakes the vector units (AVX-512 licence, clocks)
  for (int i = 0; i < bursts; ++i) {
    const auto t0 = Clock::now();
    sum += isa.burst(n);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, flops / s);
  }
  *sink = sum;  // the results are used, so no burst can be optimised away
  return best;
}

}  // namespace

FmaPeak fma_peak(int threads, int bursts, long burst_fmas) {
  if (threads < 1) PT_THROW(InputError, "fma_peak: threads must be >= 1, got ", threads);
  if (bursts < 1 || burst_fmas < 1) PT_THROW(InputError, "fma_peak: bursts and burst_fmas must be >= 1");
  const Isa isa = pick_isa();
  std::vector<double> rate(threads, 0.0);
  std::vector<float> sinks(threads, 0.0f);
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { rate[t] = best_burst_rate(isa, bursts, burst_fmas, &sinks[t]); });
  }
  FmaPeak p;
  p.threads = threads;
  p.lanes = isa.lanes;
  p.isa = isa.name;
  // Every thread gets the best thread's rate: the cores are alike, and a thread that was
  // preempted in all its bursts must not lower the bound.
  p.flops_per_thread = *std::max_element(rate.begin(), rate.end());
  p.flops = p.flops_per_thread * threads;
  return p;
}

GemmPeak gemm_peak(double seconds_per_size) {
  GemmPeak best;
  best.threads = num_threads();
  for (long n : {1024L, 1536L, 2048L}) {
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
    auto run = [&] { gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); };
    run();  // untimed: first touch of c, oneDNN's kernel selection
    double elapsed = 0, rate = 0;
    while (elapsed < seconds_per_size) {
      const auto t0 = Clock::now();
      run();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      elapsed += s;
      if (s > 0) rate = std::max(rate, 2.0 * n * n * n / s);
    }
    if (rate > best.flops) {
      best.flops = rate;
      best.n = n;
    }
  }
  return best;
}

}  // namespace paratrain::kernels::cpu
