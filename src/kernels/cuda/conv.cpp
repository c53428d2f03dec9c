// The CUDA conv2d and max-pool host entry points (kernels/cuda/conv.h): conv_steps.h's chunk
// loop over the GPU's Ops (scratch from the caching allocator, the device passes of
// conv_kernels.cu, the cuBLASLt GEMMs: f32, or bf16/f16 operands on tensor cores with f32
// accumulation).
#include "kernels/cuda/conv.h"

#include "kernels/cuda/basic.h"
#include "kernels/cuda/conv_kernels.h"
#include "kernels/cuda/conv_steps.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/conv.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda {
namespace {

using conv_detail::Geom;

// The GPU's Ops of conv_steps.h for dtype T: the device passes of conv_kernels.h and cuBLASLt.
template <DType T>
struct CudaConvOps {
  // Scratch on the current GPU (the caching allocator; stream-ordered reuse).
  Tensor scratch(int64_t n, DType dtype) const { return Tensor::empty({n}, dtype, Device::CUDA); }
  void im2col(void* col, const void* inp, int64_t cnt, const Geom& g) const {
    conv_detail::im2col<T>(col, inp, cnt, g);
  }
  void col2im_add(void* dinp, const float* dcol, int64_t cnt, const Geom& g) const {
    conv_detail::col2im_add<T>(dinp, dcol, cnt, g);
  }
  void out_from_channel_major(void* out, const float* cm, const void* bias, int64_t cnt, int64_t Co, int64_t L) const {
    conv_detail::out_from_channel_major<T>(out, cm, bias, cnt, Co, L);
  }
  void channel_major_from(void* cm, const void* dout, int64_t cnt, int64_t Co, int64_t L) const {
    conv_detail::channel_major_from<T>(cm, dout, cnt, Co, L);
  }
  void bias_grad(void* dbias, const void* dout, int64_t N, int64_t Co, int64_t L) const {
    conv_detail::bias_grad<T>(dbias, dout, N, Co, L);
  }
  void maxpool_backward_planes(float* d, const void* dout, const int32_t* argmax, int64_t planes, int64_t HW,
                               int64_t HoWo) const {
    conv_detail::maxpool_backward_planes<T>(d, dout, argmax, planes, HW, HoWo);
  }
  // The halves' products run on tensor cores into an f32 accumulator, where each product of two
  // half values is exact, so the sums are those of the f32 path on widened values, added in
  // cuBLASLt's order.
  void gemm_into_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                     int64_t ldb, float beta, float* C, int64_t ldc) const {
    if constexpr (T == DType::F32) {
      gemm<DType::F32>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    } else {
      gemm_batched_to_f32<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0);
    }
  }
  float* as_f32(void* x, int64_t n, Tensor& holder) const {
    if constexpr (T == DType::F32) {
      return static_cast<float*>(x);
    } else {
      holder = scratch(n, DType::F32);
      cast_to_f32<T>(holder.data_ptr(), x, n);
      return holder.data<float>();
    }
  }
  void narrow_back(void* x, const float* acc, int64_t n) const {
    if constexpr (T != DType::F32) cast_from_f32<T>(x, acc, n);
  }
};

}  // namespace

template <DType T>
void conv2d_forward(void* out, const void* inp, const void* weight, const void* bias, int64_t N, int64_t Ci,
                    int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad) {
  const Geom g = conv_detail::geometry(N, Ci, H, W, Co, K, stride, pad, "conv2d_forward");
  if (N == 0) return;
  CudaConvOps<T> ops;
  conv_detail::forward_chunks<T>(ops, out, inp, weight, bias, N, g, conv_detail::chunk_images(g, N));
}

template <DType T>
void conv2d_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                     int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K, int64_t stride,
                     int64_t pad) {
  const Geom g = conv_detail::geometry(N, Ci, H, W, Co, K, stride, pad, "conv2d_backward");
  CudaConvOps<T> ops;
  conv_detail::backward_chunks<T>(ops, dinp, dweight, dbias, dout, inp, weight, N, g, conv_detail::chunk_images(g, N));
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
  CudaConvOps<T> ops;
  conv_detail::maxpool_backward_steps<T>(ops, dinp, dout, argmax, N * C, H * W, Ho * Wo);
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
