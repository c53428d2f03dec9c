#include "cli/bench_compute_cmd.h"

#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::cli {

int run_bench_compute(int argc, char** argv) {
  CLI::App app{"Measure this CPU's f32 compute peak: the hardware's (FMA throughput) and the GEMM's", "bench compute"};
  int threads = kernels::cpu::num_threads();
  bool json = false;
  double seconds = 0.4;
  app.add_option("--threads", threads, "threads to measure on (default: the kernels' thread count)")
      ->check(CLI::PositiveNumber);
  app.add_option("--gemm-seconds", seconds, "seconds each GEMM size runs")->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print one JSON object instead of text");
  if (!parse_or_throw(app, argc, argv, "bench compute")) return 0;
  kernels::cpu::set_num_threads(threads);
  const auto fma = kernels::cpu::fma_peak(threads);
  const auto gemm = kernels::cpu::gemm_peak(seconds);
  if (json) {
    std::cout << nlohmann::json{{"threads", threads},
                                {"isa", fma.isa},
                                {"lanes", fma.lanes},
                                {"hardware_peak_gflops", fma.flops / 1e9},
                                {"hardware_peak_gflops_per_thread", fma.flops_per_thread / 1e9},
                                {"gemm_peak_gflops", gemm.flops / 1e9},
                                {"gemm_peak_n", gemm.n},
                                {"gemm_fraction_of_hardware", gemm.flops / fma.flops}}
                     .dump()
              << "\n";
    return 0;
  }
  std::printf("threads                 %d\n", threads);
  std::printf("hardware f32 peak       %.1f GFLOP/s  (%s, %d lanes, FMA throughput: %.1f GFLOP/s per thread)\n",
              fma.flops / 1e9, fma.isa.c_str(), fma.lanes, fma.flops_per_thread / 1e9);
  std::printf("GEMM peak (measured)    %.1f GFLOP/s  (best of f32 GEMMs 1024..2048, at %ld^3) = %.1f%% of the hardware peak\n",
              gemm.flops / 1e9, gemm.n, 100.0 * gemm.flops / fma.flops);
  return 0;
}

}  // namespace paratrain::cli
