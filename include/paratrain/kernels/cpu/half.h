// The half-type CPU kernels: bf16 and f16 (uint16_t bit patterns, paratrain/tensor/dtype.h),
// registered for (cpu, bf16) and (cpu, f16) in the dispatch tables (kernels/registry.h).
//
// What every kernel here promises (T = the template's dtype, BF16 or F16):
//  - Same shape legend, same aliasing and accumulation rules as the f32 kernel of the same
//    name (kernels/cpu/*.h): every data buffer is in T except those typed float (attention's
//    lse), integer buffers keep their types (dropout mask uint8, max-pool argmax int32).
//  - The computation is in f32: the T inputs are widened (exact), the f32 arithmetic of the
//    f32 kernel runs, and each result is rounded to T once (round to nearest even, NaN stays
//    NaN, overflow to inf). So a forward result is round_T(f32 kernel on the same values).
//  - Backward kernels accumulate: dinp_T = round_T(float(dinp_T) + gradient computed in f32),
//    one rounding per call, however many terms the f32 kernel sums (bias_backward sums the
//    rows in f32 and adds once; GEMMs accumulate in f32).
//  - No per-call allocation in steady state (thread-local grow-only scratch, reused), threads
//    as the f32 kernels (OpenMP; single-threaded inside a parallel region).
//
// Not here, by the mixed-precision policy (f32 only): layernorm, softmax, log_softmax,
// cross-entropy, embedding/encoder, the optimizers.
#pragma once

#include <cstdint>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu {

// Which path the half GEMM (gemm, gemm_batched for dtype t) takes on this CPU:
//   "onednn-bf16-native"  bf16 on a CPU with AVX512-BF16 (or AMX): oneDNN's bf16 matmul,
//                         f32 accumulation, the result rounded to bf16 once;
//   "widen-f32"           operands widened to f32 in reused scratch (AVX2/F16C conversion
//                         chosen at run time), the f32 GEMM (dnnl_sgemm), rounded back;
//   "onednn-sgemm"        f32;  "none" for other dtypes.
// Chosen at run time (CPUID and oneDNN's effective ISA), never at build time.
const char* gemm_path(DType t);
// True when this CPU (and oneDNN's ISA limit) runs bf16 dot products natively.
bool cpu_has_native_bf16();
// The conversion implementation chosen at run time: "avx2-f16c" or "scalar".
const char* half_convert_path();

namespace half {

// ---- gemm.h: A, B, C in T, f32 accumulation; C = alpha op(A) op(B) + beta C ----
template <DType T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
          const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, uint16_t* C,
          int64_t ldc);
template <DType T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                  uint16_t* C, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
                  int64_t stride_c);
// The two bf16 paths by name (gemm<BF16> picks one): the widening path runs on every CPU;
// the native one throws InputError where cpu_has_native_bf16() is false.
void gemm_bf16_widen(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                     uint16_t* C, int64_t ldc);
void gemm_bf16_native(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                      uint16_t* C, int64_t ldc);

// ---- elementwise.h (out may alias an input) ----
template <DType T> void fill(uint16_t* out, float value, int64_t n);  // out = round_T(value)
template <DType T> void copy(uint16_t* out, const uint16_t* a, int64_t n);
template <DType T> void add(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n);
template <DType T> void sub(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n);
template <DType T> void mul(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n);
template <DType T> void scale(uint16_t* out, const uint16_t* a, float s, int64_t n);
template <DType T> void axpy(uint16_t* y, const uint16_t* x, float alpha, int64_t n);
template <DType T> void mul_acc(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n);
template <DType T> void relu_forward(uint16_t* out, const uint16_t* inp, int64_t n);
template <DType T> void relu_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* inp, int64_t n);
template <DType T> void gelu_forward(uint16_t* out, const uint16_t* inp, int64_t n);
template <DType T> void gelu_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* inp, int64_t n);
template <DType T> void tanh_forward(uint16_t* out, const uint16_t* inp, int64_t n);
template <DType T> void tanh_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t n);
template <DType T> void sigmoid_forward(uint16_t* out, const uint16_t* inp, int64_t n);
template <DType T> void sigmoid_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t n);
// out (N,C) += bias (C), both T
template <DType T> void bias_add(uint16_t* out, const uint16_t* bias, int64_t N, int64_t C);
// dbias (C) += sum over the N rows of dout (N,C), summed in f32 (rows in order), added once
template <DType T> void bias_backward(uint16_t* dbias, const uint16_t* dout, int64_t N, int64_t C);
template <DType T>
void dropout_forward(uint16_t* out, const uint16_t* inp, const uint8_t* mask, float scale, int64_t n);
template <DType T>
void dropout_backward(uint16_t* dinp, const uint16_t* dout, const uint8_t* mask, float scale, int64_t n);
// out (strided view) += inp (contiguous), both T
template <DType T>
void strided_add(uint16_t* out, const uint16_t* inp, int ndim, const int64_t* sizes,
                 const int64_t* strides);

// ---- reduce.h: x in T, sums in double (exact widening), chunked as the f32 kernels ----
template <DType T> double sum(const uint16_t* x, int64_t n);
template <DType T> double sum_squares(const uint16_t* x, int64_t n);
// false when any element is inf or NaN in T (tested on the bits: all-ones exponent)
template <DType T> bool all_finite(const uint16_t* x, int64_t n);

// ---- attention.h: out, qkv, dout, dqkv in T; lse f32 (B,NH,T), may be nullptr forward ----
template <DType T>
void attention_forward(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t Tn,
                       int64_t C, int64_t NH);
template <DType T>
void attention_backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                        const uint16_t* out, const float* lse, int64_t B, int64_t Tn, int64_t C,
                        int64_t NH);

// ---- conv.h: every data buffer T; bias, dinp, dweight, dbias may be nullptr as for f32 ----
template <DType T>
void conv2d_forward(uint16_t* out, const uint16_t* inp, const uint16_t* weight,
                    const uint16_t* bias, int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co,
                    int64_t K, int64_t stride, int64_t pad);
template <DType T>
void conv2d_backward(uint16_t* dinp, uint16_t* dweight, uint16_t* dbias, const uint16_t* dout,
                     const uint16_t* inp, const uint16_t* weight, int64_t N, int64_t Ci, int64_t H,
                     int64_t W, int64_t Co, int64_t K, int64_t stride, int64_t pad);
template <DType T>
void maxpool2d_forward(uint16_t* out, int32_t* argmax, const uint16_t* inp, int64_t N, int64_t C,
                       int64_t H, int64_t W, int64_t K, int64_t stride, int64_t pad);
template <DType T>
void maxpool2d_backward(uint16_t* dinp, const uint16_t* dout, const int32_t* argmax, int64_t N,
                        int64_t C, int64_t H, int64_t W, int64_t Ho, int64_t Wo);

}  // namespace half
}  // namespace paratrain::kernels::cpu
