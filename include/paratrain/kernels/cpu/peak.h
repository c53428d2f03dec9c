// The compute peak of this CPU, measured: the denominator of model FLOPs utilisation (MFU).
//
// fma_peak() is the hardware's f32 peak: the widest fused multiply-add the CPU offers,
// chosen at run time from its flags (AVX-512F, else AVX2+FMA, else scalar), issued as
// independent chains on every thread. The rate is the best of many short bursts on each
// thread, so a burst preempted by another process lowers nothing: the figure is the
// clock x vector width x FMA units the cores actually deliver, and no f32 GEMM (nor any
// training step) can exceed it. gemm_peak() is the best rate of several large f32 GEMMs
// run long enough to be in steady state: what the GEMM library reaches, always below
// fma_peak().
//
// Thread-safety: both run their own threads (fma_peak) or the kernels' pool (gemm_peak);
// call them from one thread at a time. They take a fraction of a second (fma_peak) and
// about a second (gemm_peak); cache the result where it is used repeatedly.
#pragma once

#include <string>

namespace paratrain::kernels::cpu {

struct FmaPeak {
  double flops = 0;             // f32 FLOP/s over all `threads` (an FMA counts 2)
  double flops_per_thread = 0;  // the best thread's rate
  int threads = 0;
  int lanes = 0;                // f32 lanes of the vector used: 16 (AVX-512), 8 (AVX2), 1
  std::string isa;              // "avx512f", "avx2+fma" or "scalar"
};

// Measures on `threads` threads at once (>= 1; InputError otherwise), each running `bursts`
// bursts of `burst_fmas` vector FMAs per chain and keeping its fastest burst.
FmaPeak fma_peak(int threads, int bursts = 24, long burst_fmas = 100000);

struct GemmPeak {
  double flops = 0;  // best f32 FLOP/s (2*M*N*K per GEMM) over the sizes tried
  long n = 0;        // the square size that reached it
  int threads = 0;   // num_threads() while measuring
};

// Square f32 GEMMs of sizes 1024, 1536 and 2048 through gemm() on num_threads() threads,
// each repeated until it has run `seconds_per_size` (after one untimed run).
GemmPeak gemm_peak(double seconds_per_size = 0.4);

}  // namespace paratrain::kernels::cpu
