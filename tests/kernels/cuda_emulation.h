// A CPU emulation of the CUDA built-ins that the host-compilable kernel headers use
// (kernels/cuda/*_kernels.cuh, flash_attention_kernel.cuh), so that their tests run the
// kernels' own code on every machine: every CUDA thread of a block is a host thread,
// __syncthreads a barrier over the block, __syncwarp one over the thread's warp and
// __shfl_xor_sync an exchange through memory between two of those (a warp: 32 consecutive
// threads of the block in x-major order, as CUDA forms them; every lane of a warp must reach
// either, as CUDA's full mask requires, while a warp that has returned leaves the others
// alone), and launch() runs a grid's blocks one after
// another on one set of host threads, the block 1-D or 2-D (threadIdx.x, .y).
// A kernel's `__shared__` arrays must be `static __shared__` (valid CUDA) to be one per block
// here; `extern __shared__` memory is the includer's (one block at a time).
// launch_serial() runs every thread of every block in turn on the calling thread: much faster,
// and right for a kernel whose threads never wait for each other (no __syncthreads, no
// __syncwarp, no shuffles: reaching any of them there stops the test).
//
// Include it before the kernel header, at global scope; the names it defines are those CUDA
// gives (threadIdx, blockIdx, blockDim, uint4, float4, __nv_bfloat16, __half, ...), in the namespace
// paratrain_cuda_emulation, which the global namespace uses; to_float() widens either 16-bit
// type. Its state (the thread and block indices, the barriers) is one per program, not one per
// file: device functions with external linkage (block_reduce.cuh's, in a named namespace) are
// one definition in a program whose test files each include them, and that one must see the
// launch of whichever file runs it.
// Blocks of at most 1024 threads. Not thread-safe: one launch at a time.
#pragma once

#include <algorithm>
#include <barrier>
#include <memory>
#include <utility>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <thread>
#include <vector>

#include "paratrain/tensor/dtype.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__
#define __align__(n)

namespace paratrain_cuda_emulation {

struct Dim { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim threadIdx, blockIdx;
inline Dim blockDim, gridDim;
inline std::barrier<>* g_bar;
inline void __syncthreads() {
  if (!g_bar) {
    std::fprintf(stderr, "__syncthreads in a kernel run by launch_serial\n");
    std::abort();
  }
  g_bar->arrive_and_wait();
}
inline float g_xch[1024];
inline std::vector<std::unique_ptr<std::barrier<>>> g_warp_bars;  // one per warp of the block
inline unsigned linear_thread() { return threadIdx.y * blockDim.x + threadIdx.x; }
// A barrier over the thread's warp (every lane must reach it, as the full mask requires): what
// a warp's lanes wrote to shared memory is visible to the warp's other lanes after it.
inline void __syncwarp(unsigned = 0xffffffffu) {
  if (g_warp_bars.empty()) {
    std::fprintf(stderr, "__syncwarp in a kernel run by launch_serial\n");
    std::abort();
  }
  g_warp_bars.at(linear_thread() / 32)->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
  const unsigned t = linear_thread();
  std::barrier<>& warp = *g_warp_bars.at(t / 32);
  g_xch[t] = v;
  warp.arrive_and_wait();
  float r = g_xch[t ^ static_cast<unsigned>(o)];
  warp.arrive_and_wait();
  return r;
}
struct uint4 { uint32_t x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };  // CUDA's alignment, which 16-byte loads need
struct alignas(8) float2 { float x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
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
void launch(unsigned gx, unsigned gy, Dim block_dim, F&& f) {
  const unsigned block = block_dim.x * (block_dim.y ? block_dim.y : 1);
  std::barrier<> bar(block);
  g_bar = &bar;
  g_warp_bars.clear();
  for (unsigned w = 0; w * 32 < block; ++w)
    g_warp_bars.push_back(std::make_unique<std::barrier<>>(std::min(32u, block - w * 32)));
  blockDim = block_dim;
  if (!blockDim.y) blockDim.y = 1;
  gridDim.x = gx, gridDim.y = gy;
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < block; ++t)
    ts.emplace_back([&, t] {
      threadIdx.x = t % blockDim.x, threadIdx.y = t / blockDim.x;
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
void launch(unsigned gx, unsigned gy, unsigned block, F&& f) {
  launch(gx, gy, Dim{block, 1, 1}, std::forward<F>(f));
}

template <typename F>
void launch_serial(unsigned gx, unsigned gy, unsigned block, F&& f) {
  g_bar = nullptr;
  g_warp_bars.clear();  // a shuffle here throws (no warp to exchange with)
  blockDim = Dim{block, 1, 1};
  threadIdx.y = 0;
  gridDim.x = gx, gridDim.y = gy;
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx)
      for (unsigned t = 0; t < block; ++t) {
        blockIdx.x = bx, blockIdx.y = by, threadIdx.x = t;
        f();
      }
}

}  // namespace paratrain_cuda_emulation

using namespace paratrain_cuda_emulation;  // NOLINT: the names CUDA code finds at global scope
