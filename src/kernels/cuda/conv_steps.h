// The CUDA conv2d's host algorithm (conv.h says what it computes): the size checks, the chunks
// of images and, per chunk, the order of the device passes and GEMMs with their transposes,
// leading dimensions and betas; and the max-pool backward's widening around its pass. It is
// written over `Ops`, so that conv.cpp runs it on a GPU (its passes conv_kernels.h, its GEMMs
// cuBLASLt) and tests/kernels/conv_emulated_test.cpp runs the same code on the CPU (the passes'
// kernels over the emulated CUDA built-ins, a plain GEMM).
//
// Ops, for one dtype T (float, or bf16/f16 bits), every pointer memory of the Ops' device:
//   Buffer scratch(int64_t n, DType dtype)       n elements of dtype, alive while the Buffer is
//                                                (a Tensor: data_ptr(), data<float>())
//   im2col, col2im_add, out_from_channel_major,  conv_kernels.h's passes, for T
//   channel_major_from, bias_grad,
//   maxpool_backward_planes
//   gemm_into_f32(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc)
//                                                C (f32, M x N, row-major) = op(A) op(B) + beta C,
//                                                A and B of dtype T, f32 accumulation
//   float* as_f32(void* x, int64_t n, Buffer& holder)
//                                                x itself for f32, else widened into holder
//   narrow_back(void* x, const float* acc, int64_t n)   acc rounded into x (nothing for f32)
// Every Ops call may only queue its work (in call order); the chunk loop never waits.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/conv_kernels.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/conv.h"

namespace paratrain::kernels::cuda::conv_detail {

// Floats per scratch buffer a chunk of images may take (64 MiB).
constexpr int64_t kChunkBudget = int64_t{1} << 24;

// The CPU's checks (kernels/cpu/conv.cpp geometry(), half_layers.cpp check_conv), with its
// messages; the channel count also bounds the bias gradient's grid.
inline Geom geometry(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad,
                     const char* who) {
  if (N < 0 || Ci <= 0 || H <= 0 || W <= 0 || Co <= 0 || K <= 0 || stride <= 0 || pad < 0)
    PT_THROW(InputError, who, ": bad sizes N=", N, " Ci=", Ci, " H=", H, " W=", W, " Co=", Co, " K=", K,
             " stride=", stride, " pad=", pad);
  if (Co > INT_MAX) PT_THROW(InputError, who, ": ", Co, " output channels is above ", INT_MAX);
  return Geom{Ci, H, W, Co, K, stride, pad, cpu::conv2d_out_size(H, K, stride, pad),
              cpu::conv2d_out_size(W, K, stride, pad)};
}

// Images per chunk: each of col (R, cnt*L) and the channel-major copy (Co, cnt*L) within
// `budget` elements (at least one image).
inline int64_t chunk_images(const Geom& g, int64_t N, int64_t budget = kChunkBudget) {
  const int64_t per_image = std::max(g.rows(), g.Co) * g.cols();
  return std::max<int64_t>(1, std::min<int64_t>(N, budget / per_image));
}

// out = conv2d(inp, weight) + bias, `nb` images per chunk (N >= 1).
template <DType T, typename Ops>
void forward_chunks(Ops& ops, void* out, const void* inp, const void* weight, const void* bias, int64_t N,
                    const Geom& g, int64_t nb) {
  const int64_t R = g.rows(), L = g.cols(), Co = g.Co, es = static_cast<int64_t>(dtype_size(T));
  auto col = ops.scratch(R * nb * L, T);
  auto cm = ops.scratch(Co * nb * L, DType::F32);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = std::min(nb, N - n0);
    ops.im2col(col.data_ptr(), static_cast<const char*>(inp) + n0 * g.Ci * g.H * g.W * es, cnt, g);
    ops.gemm_into_f32(false, false, Co, cnt * L, R, weight, R, col.data_ptr(), cnt * L, 0.0f,
                      static_cast<float*>(cm.data_ptr()), cnt * L);
    ops.out_from_channel_major(static_cast<char*>(out) + n0 * Co * L * es, static_cast<const float*>(cm.data_ptr()),
                               bias, cnt, Co, L);
  }
}

// dinp, dweight and dbias (each may be nullptr) += conv2d's gradients, `nb` images per chunk.
template <DType T, typename Ops>
void backward_chunks(Ops& ops, void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                     const void* weight, int64_t N, const Geom& g, int64_t nb) {
  const int64_t R = g.rows(), L = g.cols(), Co = g.Co, es = static_cast<int64_t>(dtype_size(T));
  if (dbias) ops.bias_grad(dbias, dout, N, Co, L);
  if ((!dinp && !dweight) || N == 0) return;
  using Buffer = decltype(ops.scratch(0, T));
  Buffer dw_holder{};
  float* dw = dweight ? ops.as_f32(dweight, Co * R, dw_holder) : nullptr;  // accumulates across chunks
  auto col = ops.scratch(R * nb * L, T);
  auto cm = ops.scratch(Co * nb * L, T);
  // dcol, f32 for col2im: for f32 it reuses col (the dweight GEMM reading col is queued before
  // on the same stream); the halves' col is in their type, so dcol is its own buffer.
  Buffer dcol_holder{};
  float* dcol = nullptr;
  if (dinp) {
    if (T != DType::F32) dcol_holder = ops.scratch(R * nb * L, DType::F32);
    dcol = static_cast<float*>(T == DType::F32 ? col.data_ptr() : dcol_holder.data_ptr());
  }
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = std::min(nb, N - n0);
    ops.channel_major_from(cm.data_ptr(), static_cast<const char*>(dout) + n0 * Co * L * es, cnt, Co, L);
    if (dweight) {
      ops.im2col(col.data_ptr(), static_cast<const char*>(inp) + n0 * g.Ci * g.H * g.W * es, cnt, g);
      ops.gemm_into_f32(false, true, Co, R, cnt * L, cm.data_ptr(), cnt * L, col.data_ptr(), cnt * L, 1.0f, dw, R);
    }
    if (dinp) {
      ops.gemm_into_f32(true, false, R, cnt * L, Co, weight, R, cm.data_ptr(), cnt * L, 0.0f, dcol, cnt * L);
      ops.col2im_add(static_cast<char*>(dinp) + n0 * g.Ci * g.H * g.W * es, dcol, cnt, g);
    }
  }
  if (dweight) ops.narrow_back(dweight, dw, Co * R);
}

// dinp (planes of HW elements) += dout (planes of HoWo) routed through argmax: each plane
// added in f32 (the halves' widened, then rounded once, as the CPU does).
template <DType T, typename Ops>
void maxpool_backward_steps(Ops& ops, void* dinp, const void* dout, const int32_t* argmax, int64_t planes, int64_t HW,
                            int64_t HoWo) {
  if (planes * HW == 0) return;
  decltype(ops.scratch(0, T)) holder{};
  float* d = ops.as_f32(dinp, planes * HW, holder);
  ops.maxpool_backward_planes(d, dout, argmax, planes, HW, HoWo);
  ops.narrow_back(dinp, d, planes * HW);
}

}  // namespace paratrain::kernels::cuda::conv_detail
