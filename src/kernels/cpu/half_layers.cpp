// The bf16/f16 attention, conv2d and max-pool kernels (paratrain/kernels/cpu/half.h).
//
// Promise: round_T(the f32 kernel on the widened inputs). Each kernel widens its T operands
// into the half kernels' thread-local scratch (threaded conversion, grow-only buffers, no
// allocation in steady state), runs the f32 kernel of the same name, and narrows its
// outputs; gradients are widened first, so the f32 kernel's += lands on their old values
// and each gradient element is rounded once. Sizes are checked (InputError) before any
// output is written, by the f32 kernel's own checks or the same ones here.
//
// Scratch per call (f32): attention forward B*T*4C, backward B*T*8C (about 26 MiB at
// gpt-mini, B=8 T=256 C=384); conv the sizes of its operands.
#include "kernels/cpu/half_util.h"
#include "paratrain/kernels/cpu/attention.h"
#include "paratrain/kernels/cpu/conv.h"
#include "paratrain/kernels/cpu/half.h"

namespace paratrain::kernels::cpu::half {
namespace {

using detail::half_scratch;
using detail::narrow_n;
using detail::widen_n;

void check_attention(int64_t B, int64_t Tn, int64_t C, int64_t NH, const char* who) {
  if (B < 0 || Tn < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    PT_THROW(InputError, who, ": bad sizes B=", B, " T=", Tn, " C=", C, " NH=", NH,
             " (C must be a positive multiple of NH)");
}

// The f32 conv kernels' size checks (conv.cpp's geometry()).
void check_conv(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t K,
                int64_t stride, int64_t pad, const char* who) {
  if (N < 0 || Ci <= 0 || H <= 0 || W <= 0 || Co <= 0 || K <= 0 || stride <= 0 || pad < 0)
    PT_THROW(InputError, who, ": bad sizes N=", N, " Ci=", Ci, " H=", H, " W=", W, " Co=", Co,
             " K=", K, " stride=", stride, " pad=", pad);
}

// Widens n elements of src into scratch `slot` (nullptr in, nullptr out).
template <DType T>
float* widened(int slot, const uint16_t* src, int64_t n) {
  if (!src) return nullptr;
  float* f = half_scratch(slot, static_cast<size_t>(n));
  widen_n<T>(f, src, n);
  return f;
}

}  // namespace

template <DType T>
void attention_forward(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t Tn,
                       int64_t C, int64_t NH) {
  check_attention(B, Tn, C, NH, "attention_forward");
  const int64_t n_out = B * Tn * C;
  const float* q = widened<T>(0, qkv, 3 * n_out);
  float* o = half_scratch(1, static_cast<size_t>(n_out));
  cpu::attention_forward(o, lse, q, B, Tn, C, NH);
  narrow_n<T>(out, o, n_out);
}

template <DType T>
void attention_backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                        const uint16_t* out, const float* lse, int64_t B, int64_t Tn, int64_t C,
                        int64_t NH) {
  check_attention(B, Tn, C, NH, "attention_backward");
  const int64_t n_out = B * Tn * C, n_qkv = 3 * n_out;
  float* d = widened<T>(0, dqkv, n_qkv);
  const float* g = widened<T>(1, dout, n_out);
  const float* q = widened<T>(2, qkv, n_qkv);
  const float* o = widened<T>(3, out, n_out);
  cpu::attention_backward(d, g, q, o, lse, B, Tn, C, NH);
  narrow_n<T>(dqkv, d, n_qkv);
}

template <DType T>
void conv2d_forward(uint16_t* out, const uint16_t* inp, const uint16_t* weight,
                    const uint16_t* bias, int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co,
                    int64_t K, int64_t stride, int64_t pad) {
  check_conv(N, Ci, H, W, Co, K, stride, pad, "conv2d_forward");
  const int64_t Ho = conv2d_out_size(H, K, stride, pad), Wo = conv2d_out_size(W, K, stride, pad);
  const int64_t n_out = N * Co * Ho * Wo;
  const float* x = widened<T>(0, inp, N * Ci * H * W);
  const float* w = widened<T>(1, weight, Co * Ci * K * K);
  const float* b = widened<T>(2, bias, Co);
  float* o = half_scratch(3, static_cast<size_t>(n_out));
  cpu::conv2d_forward(o, x, w, b, N, Ci, H, W, Co, K, stride, pad);
  narrow_n<T>(out, o, n_out);
}

// The f32 backward reads inp only for dweight and weight only for dinp, so only those are
// widened (nullptr otherwise).
template <DType T>
void conv2d_backward(uint16_t* dinp, uint16_t* dweight, uint16_t* dbias, const uint16_t* dout,
                     const uint16_t* inp, const uint16_t* weight, int64_t N, int64_t Ci, int64_t H,
                     int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad) {
  check_conv(N, Ci, H, W, Co, K, stride, pad, "conv2d_backward");
  const int64_t Ho = conv2d_out_size(H, K, stride, pad), Wo = conv2d_out_size(W, K, stride, pad);
  if (!dinp && !dweight && !dbias) return;
  const int64_t n_inp = N * Ci * H * W, n_w = Co * Ci * K * K;
  const float* g = widened<T>(0, dout, N * Co * Ho * Wo);
  const float* x = widened<T>(1, dweight ? inp : nullptr, n_inp);
  const float* w = widened<T>(2, dinp ? weight : nullptr, n_w);
  float* di = widened<T>(3, dinp, n_inp);
  float* dw = widened<T>(4, dweight, n_w);
  float* db = widened<T>(5, dbias, Co);
  cpu::conv2d_backward(di, dw, db, g, x, w, N, Ci, H, W, Co, K, stride, pad);
  if (dinp) narrow_n<T>(dinp, di, n_inp);
  if (dweight) narrow_n<T>(dweight, dw, n_w);
  if (dbias) narrow_n<T>(dbias, db, Co);
}

// Max of T values is one of them: out = the f32 kernel's output exactly (narrowing is exact).
template <DType T>
void maxpool2d_forward(uint16_t* out, int32_t* argmax, const uint16_t* inp, int64_t N, int64_t C,
                       int64_t H, int64_t W, int64_t K, int64_t stride, int64_t pad) {
  if (N < 0 || C <= 0 || H <= 0 || W <= 0 || K <= 0 || stride <= 0 || pad < 0 || 2 * pad > K)
    PT_THROW(InputError, "maxpool2d_forward: bad sizes N=", N, " C=", C, " H=", H, " W=", W,
             " K=", K, " stride=", stride, " pad=", pad, " (pad must be <= K/2)");
  const int64_t Ho = conv2d_out_size(H, K, stride, pad), Wo = conv2d_out_size(W, K, stride, pad);
  const int64_t n_out = N * C * Ho * Wo;
  const float* x = widened<T>(0, inp, N * C * H * W);
  float* o = half_scratch(1, static_cast<size_t>(n_out));
  cpu::maxpool2d_forward(o, argmax, x, N, C, H, W, K, stride, pad);
  narrow_n<T>(out, o, n_out);
}

template <DType T>
void maxpool2d_backward(uint16_t* dinp, const uint16_t* dout, const int32_t* argmax, int64_t N,
                        int64_t C, int64_t H, int64_t W, int64_t Ho, int64_t Wo) {
  if (N < 0 || C <= 0 || H <= 0 || W <= 0 || Ho < 0 || Wo < 0)
    PT_THROW(InputError, "maxpool2d_backward: bad sizes");
  const int64_t n_inp = N * C * H * W;
  float* d = widened<T>(0, dinp, n_inp);
  const float* g = widened<T>(1, dout, N * C * Ho * Wo);
  cpu::maxpool2d_backward(d, g, argmax, N, C, H, W, Ho, Wo);
  narrow_n<T>(dinp, d, n_inp);
}

#define PT_HALF_INST(R, name, params) \
  template R name<DType::BF16> params; \
  template R name<DType::F16> params;
PT_HALF_INST(void, attention_forward,
             (uint16_t*, float*, const uint16_t*, int64_t, int64_t, int64_t, int64_t))
PT_HALF_INST(void, attention_backward, (uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                        const float*, int64_t, int64_t, int64_t, int64_t))
PT_HALF_INST(void, conv2d_forward, (uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                                    int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                    int64_t))
PT_HALF_INST(void, conv2d_backward, (uint16_t*, uint16_t*, uint16_t*, const uint16_t*,
                                     const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t,
                                     int64_t, int64_t, int64_t, int64_t, int64_t))
PT_HALF_INST(void, maxpool2d_forward, (uint16_t*, int32_t*, const uint16_t*, int64_t, int64_t,
                                       int64_t, int64_t, int64_t, int64_t, int64_t))
PT_HALF_INST(void, maxpool2d_backward, (uint16_t*, const uint16_t*, const int32_t*, int64_t,
                                        int64_t, int64_t, int64_t, int64_t, int64_t))
#undef PT_HALF_INST

}  // namespace paratrain::kernels::cpu::half
