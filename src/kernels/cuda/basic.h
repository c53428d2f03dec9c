// The basic CUDA kernels' host entry points, with the erased signatures of the dispatch
// tables (kernels/registry.h) so that register_basic.cpp puts them in directly.
//
// Contract: the shape legends, accumulation and aliasing rules of the CPU kernel of the same
// name (kernels/cpu/*.h; half rules in kernels/cpu/half.h): every data buffer is a device
// pointer of the current device in dtype T (float for F32, uint16_t bits for BF16/F16) unless
// the legend says f32; the math is in f32 and each half result is rounded once. Size
// arguments (and strided_add's sizes/strides arrays) are host values. Every kernel is queued
// on the current device's compute stream and returns without waiting, except sum,
// sum_squares and all_finite, which return a value: they wait for the compute stream.
// Differences from the CPU kernels: a bad token id in embedding/encoder forward or backward
// cannot throw at once: it is recorded on the device and raised as the CPU's InputError at the
// host's next wait for the GPU (tensor/cuda_device_errors.h), its forward row is NaN and its
// backward adds nothing. Sums of many terms (bias_backward, gemm) add in another order, so f32
// results differ by rounding; embedding_backward adds in the CPU's order (its bits). None adds
// with atomics: each gives the same bits from run to run.
// Thread-safety: any thread; calls from several threads on one device are ordered by the
// compute stream (the reductions hold a per-device lock while they run).
#pragma once

#include <cstdint>

#include "paratrain/kernels/cpu/optim.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cuda {

// ---- gemm.cpp (cuBLASLt): T = F32, BF16, F16; f32 accumulation and scalars ----
template <DType T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc);
template <DType T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                  int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);
// T (bf16 or f16) A and B, f32 C: the products on tensor cores, exact in the f32 accumulator
// (registry.h gemm_batched_to_f32 for bf16, the CPU's gemm_batched_bf16; conv2d's halves).
template <DType T>
void gemm_batched_to_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                         int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, int64_t batch,
                         int64_t stride_a, int64_t stride_b, int64_t stride_c);
// out (M,N) = A (M,K) op(B) + bias (N), contiguous (registry.h gemm_bias): the bias epilogue.
template <DType T>
void gemm_bias(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B, const void* bias,
               void* out);
// pre = A op(B) + bias, out = gelu(pre) (registry.h gemm_bias_gelu): the GELU_AUX_BIAS epilogue.
template <DType T>
void gemm_bias_gelu(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B, const void* bias,
                    void* pre, void* out);

// ---- elementwise.cu: T = F32, BF16, F16 ----
template <DType T> void fill(void* out, float value, int64_t n);
template <DType T> void copy(void* out, const void* a, int64_t n);
template <DType T> void add(void* out, const void* a, const void* b, int64_t n);
template <DType T> void sub(void* out, const void* a, const void* b, int64_t n);
template <DType T> void mul(void* out, const void* a, const void* b, int64_t n);
template <DType T> void scale(void* out, const void* a, float s, int64_t n);
template <DType T> void axpy(void* y, const void* x, float alpha, int64_t n);
template <DType T> void mul_acc(void* out, const void* a, const void* b, int64_t n);
template <DType T> void relu_forward(void* out, const void* inp, int64_t n);
template <DType T> void relu_backward(void* dinp, const void* dout, const void* inp, int64_t n);
template <DType T> void gelu_forward(void* out, const void* inp, int64_t n);
template <DType T> void gelu_backward(void* dinp, const void* dout, const void* inp, int64_t n);
template <DType T> void tanh_forward(void* out, const void* inp, int64_t n);
template <DType T> void tanh_backward(void* dinp, const void* dout, const void* out, int64_t n);
template <DType T> void sigmoid_forward(void* out, const void* inp, int64_t n);
template <DType T> void sigmoid_backward(void* dinp, const void* dout, const void* out, int64_t n);
template <DType T> void bias_add(void* out, const void* bias, int64_t N, int64_t C);
template <DType T> void bias_backward(void* dbias, const void* dout, int64_t N, int64_t C);
template <DType T>
void dropout_forward(void* out, const void* inp, const uint8_t* mask, float scale, int64_t n);
template <DType T>
void dropout_backward(void* dinp, const void* dout, const uint8_t* mask, float scale, int64_t n);
// The counter-based mask of kernels/cpu/elementwise.h (the same bytes as the CPU's).
void dropout_mask(uint8_t* mask, uint64_t key, float p, int64_t n);
template <DType T>
void strided_add(void* out, const void* inp, int ndim, const int64_t* sizes, const int64_t* strides);
// Casts between f32 and T = BF16, F16 (cast_from_f32 writes T, cast_to_f32 reads T).
template <DType T> void cast_from_f32(void* out, const void* in, int64_t n);
template <DType T> void cast_to_f32(void* out, const void* in, int64_t n);
// For gemm with K == 0: C (M,N) row stride ldc, `batch` matrices stride_c apart,
// C = beta * C (beta == 0 writes zeros, ignoring NaN).
template <DType T>
void scale_matrices(void* C, int64_t M, int64_t N, int64_t ldc, float beta, int64_t batch, int64_t stride_c);

// ---- reduce.cu: T = F32, BF16, F16; double accumulation; wait for the compute stream ----
template <DType T> double sum(const void* x, int64_t n);
template <DType T> double sum_squares(const void* x, int64_t n);
template <DType T> bool all_finite(const void* x, int64_t n);

// ---- embedding.cu: f32 only (the mixed-precision policy) ----
void embedding_forward(void* out, const int32_t* tokens, const void* wte, int64_t N, int64_t V, int64_t C);
void embedding_backward(void* dwte, const void* dout, const int32_t* tokens, int64_t N, int64_t V, int64_t C);
void vocab_embedding_forward(void* out, const int32_t* tokens, const void* wte, int64_t N, int64_t V, int64_t start,
                             int64_t R, int64_t C);
void vocab_embedding_backward(void* dwte, const void* dout, const int32_t* tokens, int64_t N, int64_t V,
                              int64_t start, int64_t R, int64_t C);
void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t B, int64_t T,
                     int64_t V, int64_t C);
void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int64_t B, int64_t T,
                      int64_t V, int64_t C);

// ---- optim.cu: f32 only, the CPU kernels' operations in their order, each rounded (the CPU
// build may contract some into FMAs, so results can differ in the last bit) ----
void adamw_update(void* p, const void* g, void* m, void* v, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t);
void adamw_update_multi(const cpu::AdamWTensor* list, int64_t count, float lr, float beta1, float beta2, float eps,
                        int64_t t);
void sgd_update(void* p, const void* g, void* buf, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step);

// ---- orthogonalize.cu: f32 P, double arithmetic (kernels/cpu/orthogonalize.h's rules; one
// block per call, its sums in a fixed tree, so deterministic for a given n) ----
void orthogonalize_columns(void* P, int64_t n, int64_t r);

}  // namespace paratrain::kernels::cuda
