// Element copies on a GPU for the tensor layer: a strided gather/scatter that also converts
// between dtypes (tensor copy_, contiguous(), to(dtype) on cuda tensors), and fill. Up to 8
// dimensions; conversions round like the CPU's (tensor/dtype.h: bf16 to nearest even with
// quiet NaNs, f16 to nearest even), so a copy on either device gives the same bits.
// Both run on `stream`, asynchronously; pointers are device memory of the current device.
#pragma once

#include <cstdint>

#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::cuda::detail {

constexpr int kMaxCopyDims = 8;

struct StridedLayout {
  int ndim = 0;
  int64_t shape[kMaxCopyDims] = {};
  int64_t dst_strides[kMaxCopyDims] = {};
  int64_t src_strides[kMaxCopyDims] = {};
};

// dst[layout] = convert(src[layout]) for numel elements.
void strided_convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, const StridedLayout& layout,
                     int64_t numel, Stream stream);
// Every element of dst[layout] (dst_strides) becomes `value` converted to dst_dtype.
void strided_fill(void* dst, DType dst_dtype, const StridedLayout& layout, int64_t numel, double value, Stream stream);

}  // namespace paratrain::cuda::detail
