// 2-D convolution and max-pooling, NCHW, as torch.nn.Conv2d / MaxPool2d.
//
// Square kernels, one stride and one zero padding for both spatial dims. Output size
// Ho = (H + 2*pad - K) / stride + 1 (conv2d_out_size). conv2d is im2col + GEMM over chunks
// of images, with a reused grow-only scratch buffer. Backward functions accumulate.
//
// Buffers are the caller's, row-major, and must not overlap unless stated; nothing is kept
// after a call (the im2col scratch is per calling thread and grows only).
// Thread-safety: calls from different threads on distinct buffers are safe; each call may
// itself run on the kernel thread pool (kernels::cpu::set_num_threads).
#pragma once

#include <cmath>
#include <cstdint>

namespace paratrain::kernels::cpu {

// (H + 2*pad - K) / stride + 1; InputError when not positive.
int64_t conv2d_out_size(int64_t H, int64_t K, int64_t stride, int64_t pad);

// out (N,Co,Ho,Wo), inp (N,Ci,H,W), weight (Co,Ci,K,K), bias (Co) or nullptr
void conv2d_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K,
                    int64_t stride, int64_t pad);

// dinp (N,Ci,H,W), dweight (Co,Ci,K,K), dbias (Co) += ...; each may be nullptr (not wanted).
// dout (N,Co,Ho,Wo), inp (N,Ci,H,W), weight (Co,Ci,K,K)
void conv2d_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t Ci, int64_t H,
                     int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad);

// out (N,C,Ho,Wo), argmax (N,C,Ho,Wo) int32 index h*W+w into its input plane, inp (N,C,H,W).
// Padding counts as -inf (as torch). Ties keep the first maximum in row-major window order.
void maxpool2d_forward(float* out, int32_t* argmax, const float* inp, int64_t N, int64_t C,
                       int64_t H, int64_t W, int64_t K, int64_t stride, int64_t pad);
// The scan of one output's window (host and device code: the CUDA kernel runs the same rule):
// m and am (h*W+w, -1 for a window wholly in the padding, m then -inf) over the in-bounds
// elements load(h*W+w) in row-major window order: the first, then strictly larger values; a
// NaN wins and the first NaN stays. maxpool2d_forward runs it on planes that hold a NaN or
// padding (its unpadded NaN-free planes take faster loops with the same result).
template <typename Load>
#if defined(__CUDACC__)
__host__ __device__
#endif
inline void maxpool_window(Load load, int64_t H, int64_t W, int64_t K, int64_t stride, int64_t pad, int64_t oh,
                           int64_t ow, float& m, int64_t& am) {
  m = -INFINITY;
  am = -1;
  for (int64_t kh = 0; kh < K; ++kh) {
    const int64_t ih = oh * stride - pad + kh;
    if (ih < 0 || ih >= H) continue;
    for (int64_t kw = 0; kw < K; ++kw) {
      const int64_t iw = ow * stride - pad + kw;
      if (iw < 0 || iw >= W) continue;
      const float v = load(ih * W + iw);
      if (am < 0 || v > m || v != v) {
        if (am >= 0 && m != m) continue;  // keep the first NaN
        m = v;
        am = ih * W + iw;
      }
    }
  }
}

// dinp (N,C,H,W) += dout (N,C,Ho,Wo) routed through argmax
void maxpool2d_backward(float* dinp, const float* dout, const int32_t* argmax, int64_t N,
                        int64_t C, int64_t H, int64_t W, int64_t Ho, int64_t Wo);

}  // namespace paratrain::kernels::cpu
