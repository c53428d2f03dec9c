// Element loads and stores of the CUDA layer kernels: a kernel templated on its buffer type
// T (float, or __nv_bfloat16 for bf16 buffers, whose bits are the uint16_t of the dispatch
// tables) reads with to_f32 and writes with from_f32<T>, so all its math is f32 and a bf16
// output is rounded once (round to nearest even). Device code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace paratrain::kernels::cuda::detail {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

}  // namespace paratrain::kernels::cuda::detail
