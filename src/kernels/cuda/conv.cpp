// The CUDA conv2d and max-pool host entry points (kernels/cuda/conv.h): size checks, scratch
// from the GPU's caching allocator, the chunk loop and the cuBLASLt GEMMs (f32, or bf16/f16
// operands on tensor cores with f32 accumulation) around the device passes of conv_kernels.cu.
#include "kernels/cuda/conv.h"

#include <algorithm>
#include <climits>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/conv_kernels.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/conv.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda {
namespace {

using conv_detail::Geom;

// Floats per scratch buffer a chunk of images may take (64 MiB).
constexpr int64_t kChunkBudget = int64_t{1} << 24;

// The CPU's checks (kernels/cpu/conv.cpp geometry(), half_layers.cpp check_conv), with its
// messages; the channel count also bounds the bias gradient's grid.
Geom geometry(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad,
              const char* who) {
  if (N < 0 || Ci <= 0 || H <= 0 || W <= 0 || Co <= 0 || K <= 0 || stride <= 0 || pad < 0)
    PT_THROW(InputError, who, ": bad sizes N=", N, " Ci=", Ci, " H=", H, " W=", W, " Co=", Co, " K=", K,
             " stride=", stride, " pad=", pad);
  if (Co > INT_MAX) PT_THROW(InputError, who, ": ", Co, " output channels is above ", INT_MAX);
  return Geom{Ci, H, W, Co, K, stride, pad, cpu::conv2d_out_size(H, K, stride, pad),
              cpu::conv2d_out_size(W, K, stride, pad)};
}

// Images per chunk: each of col (R, cnt*L) and the channel-major copy (Co, cnt*L) within
// the budget (at least one image).
int64_t chunk_images(const Geom& g, int64_t N) {
  const int64_t per_image = std::max(g.rows(), g.Co) * g.cols();
  return std::max<int64_t>(1, std::min<int64_t>(N, kChunkBudget / per_image));
}

// Scratch on the current GPU (the caching allocator; stream-ordered reuse), f32 unless said.
Tensor scratch(int64_t n, DType dtype = DType::F32) { return Tensor::empty({n}, dtype, Device::CUDA); }

// C (f32, M x N, row stride ldc) = A op(B) + beta C, A and B of dtype T. The halves' products
// run on tensor cores into an f32 accumulator, where each product of two half values is exact,
// so the sums are those of the f32 path on widened values, added in cuBLASLt's order.
template <DType T>
void gemm_into_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                   int64_t ldb, float beta, float* C, int64_t ldc) {
  if constexpr (T == DType::F32) {
    gemm<DType::F32>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  } else {
    gemm_batched_to_f32<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0);
  }
}

// `x` (n elements of T) as f32: x itself for F32, else widened into `holder`.
template <DType T>
float* as_f32(void* x, int64_t n, Tensor& holder) {
  if constexpr (T == DType::F32) {
    return static_cast<float*>(x);
  } else {
    holder = scratch(n);
    cast_to_f32<T>(holder.data_ptr(), x, n);
    return holder.data<float>();
  }
}

// Rounds the f32 accumulator `acc` back into x (n elements of T) when it is a widened copy.
template <DType T>
void narrow_back(void* x, const float* acc, int64_t n) {
  if constexpr (T != DType::F32) cast_from_f32<T>(x, acc, n);
}

}  // namespace

// The GEMMs take the chunk's im2col columns and the channel-major dout in T itself (f32, or
// the half type on tensor cores) and accumulate in f32.
template <DType T>
void conv2d_forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N, int64_t Ci,
                    int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad) {
  const Geom g = geometry(N, Ci, H, W, Co, K, stride, pad, "conv2d_forward");
  if (N == 0) return;
  const int64_t R = g.rows(), L = g.cols(), nb = chunk_images(g, N);
  const int64_t es = static_cast<int64_t>(dtype_size(T));
  Tensor col = scratch(R * nb * L, T), cm = scratch(Co * nb * L);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = std::min(nb, N - n0);
    conv_detail::im2col<T>(col.data_ptr(), static_cast<const char*>(inp) + n0 * Ci * H * W * es, cnt, g);
    gemm_into_f32<T>(false, false, Co, cnt * L, R, weight, R, col.data_ptr(), cnt * L, 0.0f, cm.data<float>(),
                     cnt * L);
    conv_detail::out_from_channel_major<T>(static_cast<char*>(out) + n0 * Co * L * es, cm.data<float>(), bias, cnt,
                                           Co, L);
  }
}

template <DType T>
void conv2d_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                     int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride,
                     int64_t pad) {
  const Geom g = geometry(N, Ci, H, W, Co, K, stride, pad, "conv2d_backward");
  const int64_t R = g.rows(), L = g.cols();
  if (dbias) conv_detail::bias_grad<T>(dbias, dout, N, Co, L);
  if ((!dinp && !dweight) || N == 0) return;
  const int64_t nb = chunk_images(g, N), es = static_cast<int64_t>(dtype_size(T));
  Tensor dw_holder;
  float* dw = dweight ? as_f32<T>(dweight, Co * R, dw_holder) : nullptr;  // accumulates across chunks
  Tensor col = scratch(R * nb * L, T), cm = scratch(Co * nb * L, T);
  // dcol, f32 for col2im: for f32 it reuses col (the dweight GEMM reading col is queued before
  // on the same stream); the halves' col is in their type, so dcol is its own buffer.
  Tensor dcol = !dinp ? Tensor() : T == DType::F32 ? col : scratch(R * nb * L);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t cnt = std::min(nb, N - n0);
    conv_detail::channel_major_from<T>(cm.data_ptr(), static_cast<const char*>(dout) + n0 * Co * L * es, cnt, Co, L);
    if (dweight) {
      conv_detail::im2col<T>(col.data_ptr(), static_cast<const char*>(inp) + n0 * Ci * H * W * es, cnt, g);
      gemm_into_f32<T>(false, true, Co, R, cnt * L, cm.data_ptr(), cnt * L, col.data_ptr(), cnt * L, 1.0f, dw, R);
    }
    if (dinp) {
      gemm_into_f32<T>(true, false, R, cnt * L, Co, weight, R, cm.data_ptr(), cnt * L, 0.0f, dcol.data<float>(),
                       cnt * L);
      conv_detail::col2im_add<T>(static_cast<char*>(dinp) + n0 * Ci * H * W * es, dcol.data<float>(), cnt, g);
    }
  }
  if (dweight) narrow_back<T>(dweight, dw, Co * R);
}

template <DType T>
void maxpool2d_forward(void* out, int32_t* argmax, const void* inp, int64_t N, int64_t C, int64_t H, int64_t W,
                       int64_t K, int64_t stride, int64_t pad) {
  if (N < 0 || C <= 0 || H <= 0 || W <= 0 || K <= 0 || stride <= 0 || pad < 0 || 2 * pad > K)
    PT_THROW(InputError, "maxpool2d_forward: bad sizes N=", N, " C=", C, " H=", H, " W=", W, " K=", K,
             " stride=", stride, " pad=", pad, " (pad must be <= K/2)");
  const int64_t Ho = cpu::conv2d_out_size(H, K, stride, pad), Wo = cpu::conv2d_out_size(W, K, stride, pad);
  conv_detail::maxpool_forward<T>(out, argmax, inp, N, C, H, W, K, stride, pad, Ho, Wo);
}

template <DType T>
void maxpool2d_backward(void* dinp, const void* dout, const int32_t* argmax, int64_t N, int64_t C, int64_t H,
                        int64_t W, int64_t Ho, int64_t Wo) {
  if (N < 0 || C <= 0 || H <= 0 || W <= 0 || Ho < 0 || Wo < 0) PT_THROW(InputError, "maxpool2d_backward: bad sizes");
  const int64_t n = N * C * H * W;
  if (n == 0) return;
  Tensor holder;
  float* d = as_f32<T>(dinp, n, holder);
  conv_detail::maxpool_backward_planes<T>(d, dout, argmax, N * C, H * W, Ho * Wo);
  narrow_back<T>(dinp, d, n);
}

#define PT_INST(T)                                                                                                  \
  template void conv2d_forward<T>(void*, const void*, const void*, const void*, int64_t, int64_t, int64_t, int64_t, \
                                  int64_t, int64_t, int64_t, int64_t);                                             \
  template void conv2d_backward<T>(void*, void*, void*, const void*, const void*, const void*, int64_t, int64_t,   \
                                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);                          \
  template void maxpool2d_forward<T>(void*, int32_t*, const void*, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                     int64_t, int64_t);                                                            \
  template void maxpool2d_backward<T>(void*, const void*, const int32_t*, int64_t, int64_t, int64_t, int64_t,      \
                                      int64_t, int64_t);
PT_INST(DType::F32)
PT_INST(DType::BF16)
PT_INST(DType::F16)
#undef PT_INST

}  // namespace paratrain::kernels::cuda
