// Warp and block reductions of f32 values for the CUDA layer kernels (layernorm.cu,
// softmax.cu, crossentropy.cu, attention.cu, conv_kernels.cu, orthogonalize.cu, reduce.cu).
//
// lanes_sum<W> / lanes_max<W>: over aligned groups of W lanes of a warp (attention's
// 16-thread score rows); warp_sum / warp_max: over the 32 lanes of a full warp. Every lane
// gets the result.
// block_sum / block_max: over every thread of a 1-D block whose size is a multiple of 32
// (at most 1024); every thread gets the result. They must be reached by all threads of the
// block (they synchronise), and may be called repeatedly in one kernel (each call begins
// with a barrier before it reuses its shared slots).
// block_sum_double<kThreads>: the same rules for doubles over a block of exactly kThreads
// threads (a power of two), added in one fixed tree, so the result does not depend on
// timing (the full reductions, reduce.cu and reduce_into.cu, and orthogonalize.cu).
//
// Host-compilable, as the kernel headers that call them (the shared arrays are
// `static __shared__`, one per block in CUDA and in the CPU emulation), so that the kernels'
// emulated tests (tests/kernels/*_emulated_test.cpp) run these reductions, shuffles and
// barriers included, rather than stand-ins.
#pragma once

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define PT_UNROLL _Pragma("unroll")
#else
#define PT_UNROLL
#endif

#include <cmath>

namespace paratrain::kernels::cuda::detail {

// Over aligned groups of kLanes lanes (a power of two <= 32) of a full warp: lanes 0..15
// and 16..31 for kLanes = 16; every lane gets its group's result. All 32 lanes must call.
template <int kLanes>
__device__ __forceinline__ float lanes_sum(float v) {
  static_assert(kLanes >= 2 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two up to 32");
  PT_UNROLL
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int kLanes>
__device__ __forceinline__ float lanes_max(float v) {
  static_assert(kLanes >= 2 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power of two up to 32");
  PT_UNROLL
  for (int o = kLanes / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) { return lanes_sum<32>(v); }
__device__ __forceinline__ float warp_max(float v) { return lanes_max<32>(v); }

__device__ __forceinline__ float block_sum(float v) {
  static __shared__ float slots[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // the previous call's readers are done with `slots`
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  return warp_sum(lane < nwarps ? slots[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v) {
  static __shared__ float slots[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  return warp_max(lane < nwarps ? slots[lane] : -INFINITY);
}

template <int kThreads>
__device__ __forceinline__ double block_sum_double(double v) {
  static_assert(kThreads >= 2 && kThreads <= 1024 && (kThreads & (kThreads - 1)) == 0, "a power of two up to 1024");
  static __shared__ double buf[kThreads];
  __syncthreads();  // the previous call's readers are done with `buf`
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

}  // namespace paratrain::kernels::cuda::detail

#undef PT_UNROLL
