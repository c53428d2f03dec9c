// Private helpers of the CUDA kernels (src/kernels/cuda/*.cu, gemm.cpp):
//  - stream(): the current device's compute stream (tensor/cuda.h), where every kernel runs;
//    ceil_div() for grid sizes;
//  - per_device<S>(): one S per device, made on first use on that device and kept for the
//    life of the process (never destroyed: CUDA may be torn down before static destructors);
//  - (nvcc only) launch_each / launch_over: a grid-stride loop over n elements with int64
//    indices (grid_stride.cuh: grid_for, kThreads) over a lambda or a kernel, and Elem<T>: the
//    load (widen to f32, exact) and store (round to nearest even, NaN stays NaN, overflow to
//    inf) of one element of dtype T, bit for bit the CPU rules
//    (tensor/dtype.h f32_to_bf16; kernels/cpu/half_util.h f16 scalar conversions).
// Thread-safety: stream() and per_device() may be called from any thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/dtype.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>

#include "kernels/cuda/grid_stride.cuh"
#endif

namespace paratrain::kernels::cuda::detail {

inline cudaStream_t stream() { return static_cast<cudaStream_t>(::paratrain::cuda::compute_stream()); }

// The S of the current device, constructed (on that device) by the first caller.
template <typename S>
S& per_device() {
  static std::mutex mu;
  static std::vector<S*> all;
  const int d = ::paratrain::cuda::current_device();
  std::lock_guard<std::mutex> lock(mu);
  if (all.size() <= static_cast<size_t>(d)) all.resize(static_cast<size_t>(d) + 1, nullptr);
  if (!all[d]) all[d] = new S();  // lives as long as the process (see the header comment)
  return *all[d];
}

// Blocks of d for n items (n >= 0, d >= 1).
inline unsigned ceil_div(int64_t n, int64_t d) { return static_cast<unsigned>((n + d - 1) / d); }

inline void check_count(int64_t n, const char* who) {
  if (n < 0) PT_THROW(InputError, who, ": negative element count ", n);
}

#ifdef __CUDACC__

template <typename F>
__global__ void each_index_kernel(int64_t n, F f) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) f(i);
}

// Calls f(i) for every i in [0, n) on the compute stream; n == 0 launches nothing.
template <typename F>
void launch_each(int64_t n, const char* who, F f) {
  check_count(n, who);
  if (n == 0) return;
  each_index_kernel<<<grid_for(n), kThreads, 0, stream()>>>(n, f);
  PT_CUDA_CHECK_LAUNCH();
}

// Queues kernel<<<grid_for(n), kThreads>>>(args...) on the compute stream: a kernel whose
// grid-stride loop (grid_stride.cuh) covers n elements; n == 0 launches nothing.
template <typename... Params, typename... Args>
void launch_over(int64_t n, const char* who, void (*kernel)(Params...), Args... args) {
  check_count(n, who);
  if (n == 0) return;
  kernel<<<grid_for(n), kThreads, 0, stream()>>>(args...);
  PT_CUDA_CHECK_LAUNCH();
}

template <DType T>
struct Elem;
template <>
struct Elem<DType::F32> {
  using S = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float f) { return f; }
  __device__ static bool finite(float v) { return isfinite(v); }
};
template <>
struct Elem<DType::BF16> {
  using S = uint16_t;
  __device__ static float load(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
  __device__ static uint16_t store(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>(u >> 16);
  }
  __device__ static bool finite(uint16_t v) { return (v & 0x7f80u) != 0x7f80u; }
};
template <>
struct Elem<DType::F16> {
  using S = uint16_t;
  __device__ static float load(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) return __uint_as_float(__float_as_uint(static_cast<float>(mant) * 0x1p-24f) | sign);
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  __device__ static uint16_t store(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(f));  // round to nearest even, subnormals, inf
  }
  __device__ static bool finite(uint16_t v) { return (v & 0x7c00u) != 0x7c00u; }
};

#endif  // __CUDACC__

}  // namespace paratrain::kernels::cuda::detail
