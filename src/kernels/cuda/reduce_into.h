// The CUDA reductions into device memory (kernels/cpu/reduce_into.h is the contract: shape
// legends, what each writes), with the erased signatures of the dispatch tables so that
// register_reduce_into.cpp puts them in directly.
//
// Every pointer is a device pointer of the current device (results included: slot, flag,
// out, count, g); size and factor arguments are host values. Each call only enqueues work on
// the current device's compute stream and returns without waiting: nothing is read back, so
// a caller reads the results once (one copy) when it needs them on the host.
// T = F32, BF16, F16 (float for F32, uint16_t bits for the half types; sum_scaled's out, g
// and the cross-entropy buffers are f32).
//
// Differences from the CPU kernels: the double sums (sum_squares_into, sum_scaled,
// crossentropy_mean) add in another (fixed) order -- up to 1024 blocks of 256 threads each sum
// a grid-stride share, a fixed tree combines them -- so they may differ from the CPU in the
// last bits of the double, and are deterministic for a given n. Counts and the elementwise
// results (nonfinite_into, fill_scaled, crossentropy_grad_scale) are the CPU's bit for bit.
// Thread-safety: any thread; the two-stage sums hold a per-device lock while they enqueue
// (their partials live in a per-device buffer that the compute stream's order protects).
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cuda {

template <DType T> void sum_squares_into(double* slot, const void* x, int64_t n);
template <DType T> void nonfinite_into(int32_t* flag, const void* x, int64_t n);
template <DType T> void sum_scaled(void* out, const void* x, double factor, int64_t n);
template <DType T> void fill_scaled(void* out, const void* g, double factor, int64_t n);
// f32 losses and out; count int64
void crossentropy_mean(void* out, int64_t* count, const void* losses, const int32_t* targets, int64_t N);
void crossentropy_grad_scale(void* dlosses, const void* g, const int64_t* count, int64_t N);

}  // namespace paratrain::kernels::cuda
