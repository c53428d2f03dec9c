// GEMM libraries side by side on the gpt-mini shapes: oneDNN (what paratrain's kernels use)
// against OpenBLAS (as configured on this machine, OPENBLAS_CORETYPE included), f32, at the
// thread count given (default: all cores). Prints GFLOP/s of each and the ratio; the
// figures behind docs/dependencies.md's choice.
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "paratrain/kernels/cpu.h"

namespace k = paratrain::kernels::cpu;

template <typename Fn>
double gflops(Fn fn, double flops) {
  fn();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return flops / best / 1e9;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_num_procs();
  k::set_num_threads(threads);
  openblas_set_num_threads(threads);
  struct Shape { long M, N, K; const char* what; };
  const Shape shapes[] = {{2048, 1152, 384, "qkv fwd"},  {2048, 384, 384, "attn proj"},
                          {2048, 1536, 384, "fc fwd"},   {2048, 384, 1536, "fc proj"},
                          {2048, 4096, 384, "lm head"},  {1024, 1024, 1024, "square 1024"}};
  std::printf("GEMM f32, %d threads (OPENBLAS_CORETYPE=%s)\n", threads,
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
  std::printf("%-12s %6s %6s %6s %12s %12s %7s\n", "shape", "M", "N", "K", "oneDNN GF/s", "OpenBLAS", "ratio");
  double sum_d = 0, sum_o = 0;
  for (const Shape& s : shapes) {
    std::vector<float> a(s.M * s.K, 0.5f), b(s.K * s.N, 0.25f), c(s.M * s.N);
    double f = 2.0 * s.M * s.N * s.K;
    double d = gflops([&] { k::gemm(false, false, s.M, s.N, s.K, 1.0f, a.data(), s.K, b.data(), s.N, 0.0f, c.data(), s.N); }, f);
    double o = gflops([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.M, s.N, s.K, 1.0f, a.data(), s.K, b.data(), s.N, 0.0f,
                  c.data(), s.N);
    }, f);
    sum_d += d, sum_o += o;
    std::printf("%-12s %6ld %6ld %6ld %12.1f %12.1f %6.2fx\n", s.what, s.M, s.N, s.K, d, o, d / o);
  }
  std::printf("mean: oneDNN %.1f GF/s, OpenBLAS %.1f GF/s, ratio %.2fx\n", sum_d / 6, sum_o / 6, sum_d / sum_o);
  return 0;
}
