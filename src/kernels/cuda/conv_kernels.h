// The device passes of the CUDA conv2d and max-pool (launched by conv_kernels.cu; the kernels:
// conv_kernels.cuh), for conv_steps.h and conv.cpp, which own the scratch buffers and the
// GEMMs. Private to src/kernels/cuda.
//
// Layouts (row-major, device pointers of the current GPU): inp (N,Ci,H,W), out and dout
// (N,Co,Ho,Wo) in dtype T (float, or uint16_t bits of bf16/f16); col and the channel-major
// copy of dout are in T too (the GEMMs' operands), the channel-major result of the forward and
// dcol f32 (the GEMMs' accumulators). A chunk is `cnt` consecutive images (pointers already at
// its first image); L = Ho*Wo; R = Ci*K*K.
//   col (R, cnt*L): col[r][i*L + l], r = (ci*K + kh)*K + kw, l = oh*Wo + ow, the input value
//     under that kernel tap (zero in the padding).
//   cm (Co, cnt*L): cm[co][i*L + l] = out or dout of image i, channel co.
// Every pass is queued on the compute stream and returns without waiting; a failed launch
// throws cuda::CudaError. Sizes are the caller's (conv.cpp checks them).
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cuda::conv_detail {

struct Geom {
  int64_t Ci, H, W, Co, K, stride, pad, Ho, Wo;
  int64_t rows() const { return Ci * K * K; }
  int64_t cols() const { return Ho * Wo; }
};

// col (R, cnt*L) of dtype T = im2col of the chunk inp (cnt,Ci,H,W) of dtype T (zeros in the
// padding).
template <DType T>
void im2col(void* col, const void* inp, int64_t cnt, const Geom& g);

// dinp (cnt,Ci,H,W) of dtype T += col2im(dcol (R, cnt*L)): each input element gathers its
// kernel taps in (kh, kw) order, the order in which the CPU's col2im adds them, into its
// widened old value, and is rounded once.
template <DType T>
void col2im_add(void* dinp, const float* dcol, int64_t cnt, const Geom& g);

// out (cnt,Co,L) of dtype T = cm (Co, cnt*L) + bias[co] (bias of dtype T, or nullptr),
// rounded once.
template <DType T>
void out_from_channel_major(void* out, const float* cm, const void* bias, int64_t cnt, int64_t Co, int64_t L);

// cm (Co, cnt*L) of dtype T = dout (cnt,Co,L) of dtype T in channel-major order.
template <DType T>
void channel_major_from(void* cm, const void* dout, int64_t cnt, int64_t Co, int64_t L);

// dbias (Co) of dtype T += the sum of dout (N,Co,L) over N and L: one block per channel,
// f32 partial sums per thread, a fixed tree (deterministic), one rounding.
template <DType T>
void bias_grad(void* dbias, const void* dout, int64_t N, int64_t Co, int64_t L);

// out (N,C,Ho,Wo) of dtype T, argmax (N,C,Ho,Wo): the CPU's window scan (cpu::maxpool_window:
// first in-bounds element, then strictly larger values, the first NaN kept), one thread per
// output element.
template <DType T>
void maxpool_forward(void* out, int32_t* argmax, const void* inp, int64_t N, int64_t C, int64_t H, int64_t W,
                     int64_t K, int64_t stride, int64_t pad, int64_t Ho, int64_t Wo);

// d (N*C planes of H*W, f32) += dout (N,C,Ho,Wo) of dtype T routed through argmax: one
// thread per plane adds its outputs in order, as the CPU does (overlapping windows add to
// one input element in the CPU's order, so f32 results are the CPU's bit for bit).
template <DType T>
void maxpool_backward_planes(float* d, const void* dout, const int32_t* argmax, int64_t planes, int64_t HW,
                             int64_t HoWo);

}  // namespace paratrain::kernels::cuda::conv_detail
