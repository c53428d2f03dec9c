// The CUDA conv2d and max-pool kernels' host entry points (conv.cpp), with the erased
// signatures of the dispatch tables; register_layers.cpp puts them in for Device::CUDA.
//
// Contract: kernels/cpu/conv.h (shape legends, NCHW, square kernels, one stride and zero
// padding for both dims; forward overwrites, backward accumulates into every gradient that
// is not nullptr) and, for T = BF16/F16, kernels/cpu/half.h's rule: round_T(the f32 kernel
// on the widened operands), each output and gradient element rounded once. Every data
// pointer is a device pointer of the current GPU in dtype T (argmax int32); sizes are host
// values, checked as the CPU checks them (InputError, before anything is queued).
//
// How: conv2d is im2col + one cuBLASLt GEMM per chunk of images (the images of a chunk side
// by side: out (Co, cnt*Ho*Wo) = weight (Co, Ci*K*K) @ col (Ci*K*K, cnt*Ho*Wo)) into f32, then
// a pass that puts the result in (N,Co,Ho,Wo) order, adds the bias and rounds. Backward: dout
// goes to channel-major order, dweight += dout_cm @ col^T (one GEMM per chunk, K =
// cnt*Ho*Wo), dcol (f32) = weight^T @ dout_cm, and col2im gathers each input element's taps
// into dinp (no atomics); dbias is a per-channel block reduction. f32 GEMMs are exact f32 (no
// TF32). Half types keep col, dout_cm and the weight in their type and multiply on tensor
// cores into f32 (each product of two half values is exact there, so the sums are the f32
// kernel's on the widened operands in another order), and round once. Scratch (col, the
// channel-major copy, dcol, the widened dweight) comes from the GPU's caching allocator, about
// 64 MiB at most per buffer (chunks are sized to it), and is released at return: the
// stream-ordered reuse keeps it valid for the queued work.
// max-pool: one thread per output scans its window as the CPU's general loop does (same
// argmax, ties and NaN rules); the backward runs one thread per (n, c) plane adding its
// outputs in the CPU's order, so f32 results are the CPU's bit for bit (halves: the plane is
// widened, accumulated and rounded once, as on the CPU).
//
// Differences from the CPU: the GEMMs' and the bias sum's summation orders, so f32 results
// differ by rounding. Every call only queues work on the compute stream (no host wait).
// Thread-safety: as the other CUDA kernels (kernels/cuda/basic.h).
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cuda {

template <DType T>
void conv2d_forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N, int64_t Ci,
                    int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad);
template <DType T>
void conv2d_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                     int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride,
                     int64_t pad);
template <DType T>
void maxpool2d_forward(void* out, int32_t* argmax, const void* inp, int64_t N, int64_t C, int64_t H, int64_t W,
                       int64_t K, int64_t stride, int64_t pad);
template <DType T>
void maxpool2d_backward(void* dinp, const void* dout, const int32_t* argmax, int64_t N, int64_t C, int64_t H,
                        int64_t W, int64_t Ho, int64_t Wo);

}  // namespace paratrain::kernels::cuda
