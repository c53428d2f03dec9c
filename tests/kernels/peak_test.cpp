// The compute peak (MFU's denominator) is measured with the widest vector the CPU has, and
// bounds what a GEMM reaches on the same threads.
#include <gtest/gtest.h>

#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu.h"

namespace kc = paratrain::kernels::cpu;

TEST(ComputePeak, UsesTheWidestVectorTheCpuHas) {
  const kc::FmaPeak p = kc::fma_peak(1, 4, 20000);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(p.isa, "avx512f");
    EXPECT_EQ(p.lanes, 16);
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_EQ(p.isa, "avx2+fma");
    EXPECT_EQ(p.lanes, 8);
  } else {
    EXPECT_EQ(p.isa, "scalar");
  }
  // At least one FMA of `lanes` per cycle of a 0.5 GHz clock: a wrong count (a chain the
  // compiler removed, or flops left uncounted) gives far other figures.
  EXPECT_GT(p.flops_per_thread, 2.0 * p.lanes * 0.5e9);
  // And at most 4 FMA units at 6 GHz: more means time was not measured.
  EXPECT_LT(p.flops_per_thread, 2.0 * p.lanes * 4 * 6e9);
}

TEST(ComputePeak, ScalesWithThreadsAndRejectsNone) {
  const kc::FmaPeak p = kc::fma_peak(3, 4, 20000);
  EXPECT_EQ(p.threads, 3);
  EXPECT_DOUBLE_EQ(p.flops, 3 * p.flops_per_thread);
  EXPECT_THROW(kc::fma_peak(0), paratrain::InputError);
  EXPECT_THROW(kc::fma_peak(1, 0), paratrain::InputError);
}

TEST(ComputePeak, GemmStaysBelowTheHardwarePeak) {
  kc::set_num_threads(1);
  // The bound is the best of many bursts before and after the GEMM (about 0.5 s in all), so
  // that a busy neighbour (another test, a sibling hyperthread) during a few milliseconds of
  // bursts cannot put it below a GEMM that found a quiet moment.
  const kc::FmaPeak before = kc::fma_peak(1, 1000);
  const kc::GemmPeak g = kc::gemm_peak(0.05);
  const kc::FmaPeak after = kc::fma_peak(1, 1000);
  const kc::FmaPeak& p = before.flops > after.flops ? before : after;
  EXPECT_EQ(g.threads, 1);
  EXPECT_GT(g.flops, 0);
  EXPECT_TRUE(g.n == 1024 || g.n == 1536 || g.n == 2048) << g.n;
  EXPECT_LE(g.flops, p.flops) << "a GEMM faster than the FMA units: the hardware peak is not an upper bound";
}
