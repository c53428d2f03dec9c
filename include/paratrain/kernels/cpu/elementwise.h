// Elementwise kernels over flat f32 arrays of n elements, plus row-broadcast bias ops,
// dropout, dtype conversions and strided copies.
//
// Vectorised (AVX2/FMA where compiled for it) and threaded for large n. Outputs of forward
// ops are overwritten and may alias an input (out == a is fine). Backward ops accumulate:
// dinp += ... (see kernels/cpu.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace paratrain::kernels::cpu {

// ---- arithmetic: a, b, out (n) ----
void fill(float* out, float value, int64_t n);
void copy(float* out, const float* a, int64_t n);
void add(float* out, const float* a, const float* b, int64_t n);   // out = a + b
void sub(float* out, const float* a, const float* b, int64_t n);   // out = a - b
void mul(float* out, const float* a, const float* b, int64_t n);   // out = a * b
void div(float* out, const float* a, const float* b, int64_t n);   // out = a / b
void scale(float* out, const float* a, float s, int64_t n);        // out = s * a
void add_scalar(float* out, const float* a, float s, int64_t n);   // out = a + s
void axpy(float* y, const float* x, float alpha, int64_t n);       // y += alpha * x
void axpby(float* y, const float* x, float alpha, float beta, int64_t n);  // y = alpha*x + beta*y
// out += a * b (the backward of mul: dinp_a += dout * b)
void mul_acc(float* out, const float* a, const float* b, int64_t n);

// ---- activations: inp, out, dout, dinp (n) ----
void relu_forward(float* out, const float* inp, int64_t n);
// dinp += dout * (inp > 0)
void relu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch approximate='tanh'
void gelu_forward(float* out, const float* inp, int64_t n);
// dinp += dout * gelu'(inp)
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);
void tanh_forward(float* out, const float* inp, int64_t n);
// dinp += dout * (1 - out^2), out the forward's output
void tanh_backward(float* dinp, const float* dout, const float* out, int64_t n);
void sigmoid_forward(float* out, const float* inp, int64_t n);
// dinp += dout * out * (1 - out), out the forward's output
void sigmoid_backward(float* dinp, const float* dout, const float* out, int64_t n);
void exp_forward(float* out, const float* inp, int64_t n);
void log_forward(float* out, const float* inp, int64_t n);
void sqrt_forward(float* out, const float* inp, int64_t n);

// ---- row-broadcast bias: out, dout (N,C), bias, dbias (C) ----
// out[n,c] += bias[c]
void bias_add(float* out, const float* bias, int64_t N, int64_t C);
// dbias[c] += sum_n dout[n,c]
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C);

// ---- dropout with a given mask: inp, out, dout, dinp, mask (n) ----
// out = inp * mask * scale (as torch: NaN/inf inputs stay NaN where dropped), mask[i] in {0,1},
// scale usually 1/(1-p)
void dropout_forward(float* out, const float* inp, const uint8_t* mask, float scale, int64_t n);
// dinp += dout * mask * scale
void dropout_backward(float* dinp, const float* dout, const uint8_t* mask, float scale, int64_t n);
// A mask drawn from one 64-bit key, counter-based (element i alone decides mask[i], so a GPU
// draws it without a host loop or a copy): u_i = top 24 bits of splitmix64(key + (i + 1) *
// 0x9E3779B97F4A7C15) / 2^24, mask[i] = u_i >= p. Integer arithmetic only: the CUDA kernel of
// the same table gives the same bytes. Keyed by (device, U8) in the dispatch tables.
void dropout_mask(uint8_t* mask, uint64_t key, float p, int64_t n);

// One element of dropout_mask (host and device code).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline uint8_t dropout_keep(uint64_t key, int64_t i, float p) {
  uint64_t z = key + static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) >= p ? 1 : 0;
}

// ---- dtype conversions (round to nearest even, as PyTorch; NaN stays NaN; subnormals kept;
// vectorised with AVX2/F16C when the CPU has them, chosen at run time): in, out (n) ----
void f32_to_bf16(uint16_t* out, const float* in, int64_t n);
void bf16_to_f32(float* out, const uint16_t* in, int64_t n);
void f32_to_f16(uint16_t* out, const float* in, int64_t n);
void f16_to_f32(float* out, const uint16_t* in, int64_t n);

// ---- strided views ----
// Gathers a strided view of up to 6 dims into contiguous row-major out.
// sizes (ndim), strides (ndim) in elements of elem_size bytes (strides may be 0 or negative);
// out holds prod(sizes) elements. Any element size (1, 2, 4, 8, ...).
void strided_copy(void* out, const void* inp, size_t elem_size, int ndim, const int64_t* sizes,
                  const int64_t* strides);
// The backward of a view: scatters contiguous f32 inp (prod(sizes)) into the strided view
// out += inp. The view must not map two elements to one address (no 0 strides).
void strided_add(float* out, const float* inp, int ndim, const int64_t* sizes,
                 const int64_t* strides);
// The same for bf16 / f16 out and inp: out = round(float(out) + float(inp)) per element.
void strided_add_bf16(uint16_t* out, const uint16_t* inp, int ndim, const int64_t* sizes,
                      const int64_t* strides);
void strided_add_f16(uint16_t* out, const uint16_t* inp, int ndim, const int64_t* sizes,
                     const int64_t* strides);

}  // namespace paratrain::kernels::cpu
