// The CUDA layer kernels (LayerNorm, softmax, log-softmax, fused softmax + cross-entropy,
// fused causal attention) as host entry points with the CPU kernels' signatures and shape
// legends (paratrain/kernels/cpu/{layernorm,softmax,attention}.h are the contract:
// forward overwrites, backward accumulates, crossentropy_backward overwrites dlogits).
// register_layers.cpp puts them into the dispatch tables for Device::CUDA.
//
// Every pointer is a device pointer of the current device; each call only enqueues work on
// that device's compute stream (paratrain::cuda::compute_stream()) and returns without
// waiting. Bad sizes throw InputError before anything is enqueued; a failed launch throws
// cuda::CudaError. uint16_t buffers hold bf16 bits; statistics (mean, rstd, lse, losses,
// dlosses) are f32. All math is f32.
//
// Differences from the CPU kernels, forced by running asynchronously:
//  - crossentropy: a target outside [0,V) (and not kIgnoreIndex) cannot throw; its row's
//    loss is NaN in the forward and its dlogits row is NaN in the backward, so a training
//    step's non-finite check sees it.
//  - layernorm_backward sums dweight/dbias per block of 256 rows, then adds the blocks in
//    order: another order than the CPU's, the same bits every run.
//  - attention: the flash kernels take head sizes 32, 64 and 128 (and say why they do not
//    take another shape); the GEMM attention (kernels/attention_by_gemm.h) takes any.
//
// Thread-safety: as the CUDA runtime; calls on one stream run in order.
#pragma once

#include <cstdint>
#include <string>

#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cuda {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);

void softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);
void log_softmax_forward(float* out, const float* inp, int64_t N, int64_t C);
void log_softmax_backward(float* dinp, const float* dout, const float* out, int64_t N, int64_t C);

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t ld);
void crossentropy_forward_bf16(float* losses, float* lse, const uint16_t* logits, const int32_t* targets,
                               int64_t N, int64_t V, int64_t ld);
void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V, int64_t ld);
void crossentropy_backward_bf16(uint16_t* dlogits, const float* dlosses, const uint16_t* logits,
                                const float* lse, const int32_t* targets, int64_t N, int64_t V, int64_t ld);
void crossentropy_forward_f16(float* losses, float* lse, const uint16_t* logits, const int32_t* targets, int64_t N,
                              int64_t V, int64_t ld);
void crossentropy_backward_f16(uint16_t* dlogits, const float* dlosses, const uint16_t* logits, const float* lse,
                               const int32_t* targets, int64_t N, int64_t V, int64_t ld);

// The shared memory (bytes) a block of the flash kernels needs for a head size: the larger of
// the forward's and the backward's; 0 for a head size they do not take.
int64_t flash_attention_shared_bytes(int64_t head_size);
// Why the flash kernels do not take this attention on the current GPU, in words ("head size 80
// (they take 32, 64 and 128)", "cuda:0 is compute capability 7.5, and WMMA on bf16 needs
// 8.0", "qkv is not 16-byte aligned", ...), or "" when they do. The shape is judged before the
// GPU is asked, so a shape they never take needs no GPU. dout may be null (the forward).
// f32 asks the f32 kernels (flash_attention_f32_refusal). InputError for bad sizes or a dtype
// other than f32, bf16 and f16.
std::string flash_attention_refusal(DType dtype, int64_t B, int64_t T, int64_t C, int64_t NH, const void* qkv,
                                    const void* dout = nullptr);
// The fused causal attention forward on tensor cores (flash_attention.cu): `dtype` (bf16 or
// f16; any other is an InputError) q/k/v and out, f32 lse (may be null), FlashAttention-2's
// forward with P rounded to `dtype` before P V. Head size 32, 64 or 128, C % 8 == 0, qkv
// 16-byte aligned, B * NH <= 65535, a GPU with WMMA on `dtype` (bf16: compute capability 8.0 or
// newer; f16: 7.0) whose blocks may opt into flash_attention_shared_bytes(head size) of shared
// memory (head size 128 needs more than Turing's 64 KiB); false (nothing run) otherwise, with
// flash_attention_refusal's reason in *why when why is not null.
bool attention_forward_flash(DType dtype, uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH, std::string* why = nullptr);
// Its backward: dqkv += the gradient (rounded once per element), from dout, qkv, out and the
// forward's lse; P and dS rounded to `dtype` before their products. Two kernels (dK/dV per key
// tile, dQ per query tile): every element has one writer, the same bits every run. The same
// shapes as the forward, dout 16-byte aligned, lse not null; false otherwise.
bool attention_backward_flash(DType dtype, uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                              const uint16_t* out, const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);
// The fused causal attention in f32 arithmetic on the CUDA cores (flash_attention_f32.cu):
// FlashAttention-2's scheme with f32 FMAs (no TF32), register-tiled, over `dtype` (f32, bf16 or
// f16; any other is an InputError) q/k/v, out, dout and dqkv, widened to f32 (P and dS are not
// rounded: the CPU's contract), results rounded once; f32 lse (may be null in the forward, not
// in the backward). Head size 32, 64 or 128, qkv and dout 16-byte aligned, B * NH <= 65535, a
// GPU whose blocks may opt into flash_attention_f32_shared_bytes(head size) of shared memory
// (head size 64 and 128 need more than Turing's 64 KiB); false (nothing run) otherwise, with
// flash_attention_f32_refusal's reason in *why (the forward) when why is not null. The backward
// adds into dqkv (two kernels, one writer per element: the same bits every run).
int64_t flash_attention_f32_shared_bytes(int64_t head_size);
std::string flash_attention_f32_refusal(int64_t B, int64_t T, int64_t C, int64_t NH, const void* qkv,
                                        const void* dout = nullptr);
bool attention_forward_flash_f32(DType dtype, void* out, float* lse, const void* qkv, int64_t B, int64_t T,
                                 int64_t C, int64_t NH, std::string* why = nullptr);
bool attention_backward_flash_f32(DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out,
                                  const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);
// Which flash kernels run an attention: the tensor-core ones (bf16 and f16; f32 has only the
// f32-arithmetic ones, which then run) or the f32-arithmetic ones for every dtype.
enum class FlashKernels { kTensorCores, kF32Arithmetic };
// attention_{forward,backward}_flash or attention_{forward,backward}_flash_f32, as `kernels` and
// the dtype choose, over untyped buffers: what the attention tables run under
// PARATRAIN_CUDA_ATTENTION=flash (kTensorCores) and =tiles (kF32Arithmetic).
bool attention_forward_flash(FlashKernels kernels, DType dtype, void* out, float* lse, const void* qkv, int64_t B,
                             int64_t T, int64_t C, int64_t NH, std::string* why = nullptr);
bool attention_backward_flash(FlashKernels kernels, DType dtype, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);
// The pieces of the attention by batched GEMMs (attention_parts.cu; contract:
// kernels/cpu/attention_parts.h).
void attention_split_heads(float* heads, const float* x, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P);
void attention_split_heads_bf16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P);
void attention_split_heads_f16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P);
void attention_merge_heads(float* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P,
                           bool accumulate);
void attention_merge_heads_bf16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P, bool accumulate);
void attention_merge_heads_f16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P, bool accumulate);
void attention_chunk_softmax(float* S, float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows);
void attention_chunk_probs(float* S, const float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows);
void attention_chunk_dscores(float* dP, const float* P, const float* D, int64_t BH, int64_t T, int64_t r0,
                             int64_t rows);
void attention_rowdot(float* D, const float* dO, const float* O, int64_t BH, int64_t T, int64_t hs);

}  // namespace paratrain::kernels::cuda
