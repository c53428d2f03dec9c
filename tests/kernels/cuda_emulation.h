// A CPU emulation of the CUDA built-ins that the host-compilable kernel headers use
// (kernels/cuda/*_kernels.cuh, flash_attention_kernel.cuh), so that their tests run the
// kernels' own code on every machine: every CUDA thread of a block is a host thread,
// __syncthreads a barrier over the block, __shfl_xor_sync an exchange through memory between
// two barriers (so every thread of the block must reach it, as the kernels' uniform loops do),
// and launch() runs a grid's blocks one after another on one set of host threads.
// launch_serial() runs every thread of every block in turn on the calling thread: much faster,
// and right for a kernel whose threads never wait for each other (no __syncthreads, no
// shuffles: reaching either there aborts).
//
// Include it before the kernel header, at global scope; the names it defines are those CUDA
// gives (threadIdx, blockIdx, blockDim, uint4, __nv_bfloat16, __half, ...), in an unnamed
// namespace; to_float() widens either 16-bit type.
// Blocks of at most 1024 threads. Not thread-safe: one launch at a time.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <thread>
#include <vector>

#include "paratrain/tensor/dtype.h"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__
#define __align__(n)

namespace {

struct Dim { unsigned x = 0, y = 0, z = 0; };
thread_local Dim threadIdx, blockIdx;
Dim blockDim, gridDim;
std::barrier<>* g_bar;
inline void __syncthreads() {
  if (!g_bar) {
    std::fprintf(stderr, "__syncthreads in a kernel run by launch_serial\n");
    std::abort();
  }
  g_bar->arrive_and_wait();
}
float g_xch[1024];
inline float __shfl_xor_sync(unsigned, float v, int o) {
  g_xch[threadIdx.x] = v;
  __syncthreads();
  float r = g_xch[threadIdx.x ^ o];
  __syncthreads();
  return r;
}
struct uint4 { uint32_t x, y, z, w; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
struct __nv_bfloat16 { uint16_t bits; };
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {paratrain::f32_to_bf16(f)}; }  // the CPU's rule
struct __half { uint16_t bits; };
inline __half __float2half_rn(float f) { return {paratrain::f32_to_f16(f)}; }
inline float to_float(__nv_bfloat16 x) { return paratrain::bf16_to_f32(x.bits); }
inline float to_float(__half x) { return paratrain::f16_to_f32(x.bits); }

// Runs f as a grid (gx, gy) of blocks of `block` threads, one block after another: `block`
// host threads run every block in turn, with a barrier between blocks (which share memory
// that stands for the block's shared memory).
template <typename F>
void launch(unsigned gx, unsigned gy, unsigned block, F&& f) {
  std::barrier<> bar(block);
  g_bar = &bar;
  blockDim.x = block;
  gridDim.x = gx, gridDim.y = gy;
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < block; ++t)
    ts.emplace_back([&, t] {
      threadIdx.x = t;
      for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
          blockIdx.x = bx, blockIdx.y = by;
          f();
          bar.arrive_and_wait();
        }
    });
  for (auto& th : ts) th.join();
  g_bar = nullptr;
}

template <typename F>
void launch_serial(unsigned gx, unsigned gy, unsigned block, F&& f) {
  g_bar = nullptr;
  blockDim.x = block;
  gridDim.x = gx, gridDim.y = gy;
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx)
      for (unsigned t = 0; t < block; ++t) {
        blockIdx.x = bx, blockIdx.y = by, threadIdx.x = t;
        f();
      }
}

}  // namespace
