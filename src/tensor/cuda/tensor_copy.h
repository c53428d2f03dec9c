// The tensor layer's copies and fills where a GPU is involved (Tensor::copy_, zeros, fill_,
// to(DeviceSpec)): host <-> device, device <-> device (peer copies between GPUs), and
// strided or converting copies on a GPU. Defined in tensor_copy.cpp with CUDA; without, no
// tensor can be on a GPU and these throw InputError.
#pragma once

#include "paratrain/tensor/tensor.h"

namespace paratrain::detail {

// dst and src have the same shape; at least one is on a GPU.
void cuda_copy(Tensor& dst, const Tensor& src);
// dst is on a GPU.
void cuda_fill(Tensor& dst, double value);

}  // namespace paratrain::detail
