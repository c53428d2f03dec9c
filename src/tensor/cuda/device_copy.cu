// Strided, converting copies and fills on a GPU (device_copy.h).
#include <cuda_fp16.h>

#include "paratrain/tensor/cuda_check.h"
#include "tensor/cuda/device_copy.h"

namespace paratrain::cuda::detail {

namespace {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

// The CPU's f32_to_bf16 (tensor/dtype.h), bit for bit.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ double load(const void* base, int64_t off, DType t) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[off];
    case DType::BF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[off]);
    case DType::F16: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(base)[off]));
    case DType::I32: return static_cast<const int32_t*>(base)[off];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(base)[off]);
    case DType::U8: return static_cast<const uint8_t*>(base)[off];
    case DType::U16: return static_cast<const uint16_t*>(base)[off];
  }
  return 0;
}

__device__ __forceinline__ void store(void* base, int64_t off, DType t, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[off] = static_cast<float>(v); break;
    case DType::BF16: static_cast<uint16_t*>(base)[off] = f32_to_bf16_bits(static_cast<float>(v)); break;
    case DType::F16: static_cast<uint16_t*>(base)[off] = __half_as_ushort(__float2half_rn(static_cast<float>(v))); break;
    case DType::I32: static_cast<int32_t*>(base)[off] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(base)[off] = static_cast<int64_t>(v); break;
    case DType::U8: static_cast<uint8_t*>(base)[off] = static_cast<uint8_t>(v); break;
    case DType::U16: static_cast<uint16_t*>(base)[off] = static_cast<uint16_t>(v); break;
  }
}

// Offsets of row-major element i in the two layouts.
__device__ __forceinline__ void offsets(const StridedLayout& l, int64_t i, int64_t& dst_off, int64_t& src_off) {
  dst_off = 0;
  src_off = 0;
  for (int d = l.ndim - 1; d >= 0; --d) {
    const int64_t idx = i % l.shape[d];
    i /= l.shape[d];
    dst_off += idx * l.dst_strides[d];
    src_off += idx * l.src_strides[d];
  }
}

__global__ void strided_convert_kernel(void* dst, DType dt, const void* src, DType st, StridedLayout l, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t doff, soff;
    offsets(l, i, doff, soff);
    if (dt == st && dt == DType::I64)  // exact for every int64 (a double holds 53 bits)
      static_cast<int64_t*>(dst)[doff] = static_cast<const int64_t*>(src)[soff];
    else
      store(dst, doff, dt, load(src, soff, st));
  }
}

__global__ void strided_fill_kernel(void* dst, DType dt, StridedLayout l, int64_t n, double v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t doff, soff;
    offsets(l, i, doff, soff);
    store(dst, doff, dt, v);
  }
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

}  // namespace

void strided_convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, const StridedLayout& layout,
                     int64_t numel, Stream stream) {
  if (numel <= 0) return;
  constexpr int kThreads = 256;
  strided_convert_kernel<<<grid_for(numel, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, dst_dtype, src, src_dtype, layout, numel);
  PT_CUDA_CHECK_LAUNCH();
}

void strided_fill(void* dst, DType dst_dtype, const StridedLayout& layout, int64_t numel, double value, Stream stream) {
  if (numel <= 0) return;
  constexpr int kThreads = 256;
  strided_fill_kernel<<<grid_for(numel, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      dst, dst_dtype, layout, numel, value);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace paratrain::cuda::detail
