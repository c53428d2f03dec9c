// `paratrain bench compute`: this CPU's compute peak, the denominator of MFU.
#pragma once

namespace paratrain::cli {

// Prints the hardware f32 peak (kernels::cpu::fma_peak) and the best large-GEMM rate
// (kernels::cpu::gemm_peak) on --threads threads, as text or (--json) one JSON line.
// Returns the exit code (0 ok, 2 bad usage).
int run_bench_compute(int argc, char** argv);

}  // namespace paratrain::cli
