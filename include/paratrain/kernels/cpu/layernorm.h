// LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance).
//
// Forward saves mean and rstd = 1/sqrt(var + eps) per row for the backward.
// Backward accumulates into dinp, dweight and dbias.
//
// Buffers are the caller's (inp, out (N,C), weight/bias (C), mean/rstd (N)); nothing is
// kept after a call.
// Thread-safety: calls from different threads on distinct buffers are safe; each call may
// itself run on the kernel thread pool (kernels::cpu::set_num_threads).
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

constexpr float kLayerNormEps = 1e-5f;

// out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C)
// weight and bias may be nullptr (no affine: weight 1, bias 0); mean/rstd may be nullptr
// when no backward follows.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t N, int64_t C,
                       float eps = kLayerNormEps);

// dinp (N,C), dweight (C), dbias (C), dout (N,C), inp (N,C), weight (C), mean (N), rstd (N)
// dinp, dweight, dbias += ...; any of the three may be nullptr (not wanted); weight may be
// nullptr (no affine).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t N, int64_t C);

}  // namespace paratrain::kernels::cpu
