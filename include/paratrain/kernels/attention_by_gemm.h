// Causal self-attention as batched GEMMs over every head at once, the attention kernels of
// the CUDA tables (the CPU keeps its fused attention.h; this runs there too, for the tests).
// The contract is kernels/cpu/attention.h's: qkv (B,T,3C), out (B,T,C), lse (B,NH,T) f32,
// dqkv += the gradient; every product, softmax and sum in f32, a bf16 result rounded once.
//
// How: q, k, v (and out, dout in the backward) are copied head-major in f32, (B*NH, T, hs);
// the query rows go in chunks of R rows (at most 128, fewer where a chunk of scores
// (B*NH, R, T) f32 would pass 128 MiB), and for the chunk [r0, r0+R), keys 0 .. r0+R-1 only
// (causal):
//   forward:  S = scale Q_c K^T;  P = softmax(S) masked, lse saved;  O_c = P V
//   backward: P = exp(scale Q_c K^T - lse) masked;  dV += P^T dO_c;  dP = dO_c V^T;
//             dS = P (dP - D), D = rowsum(dO O);  dQ_c = scale dS K;  dK += scale dS^T Q_c
// with the device's gemm_batched (one call per GEMM per chunk, the batch = every head) and
// the row passes of kernels/cpu/attention_parts.h (the device's tables). So no (T,T) matrix
// is held for T > 128: one chunk of R query rows against its keys, in scratch of the device's
// allocator, freed (stream-ordered) when the call returns. Each GEMM is the f32 GEMM of the
// device: on a GPU cuBLASLt's f32 SGEMM (no TF32), the same arithmetic as the CPU's.
//
// attention_by_gemm_forward/backward<D, T>: the table signatures of attention_forward and
// attention_backward for device D and dtype T (f32, bf16 or f16), with the query rows per chunk
// after them (0: attention_chunk_rows()); sizes checked as attention.h's.
//
// bf16_products (T = bf16 only; f32 ignores it): every GEMM takes bf16 operands with f32
// accumulation and an f32 result (gemm_batched_to_f32; tensor cores on a GPU). q, k, v and
// dout came from bf16, so S = Q K^T and dP = dO V^T are exactly the f32 path's products;
// P and dS are rounded to bf16 before P V, P^T dO, dS K and dS^T Q, as FlashAttention does.
// That rounding is not the CPU's contract (P and dS stay f32 there): the result differs
// from the f32 path by about bf16's precision, within the bf16 comparisons' tolerance.
// Thread-safety: as any kernel (the caller's buffers; the device's stream on a GPU).
#pragma once

#include <cstdint>

#include "paratrain/tensor/device.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels {

template <Device D, DType T>
void attention_by_gemm_forward(void* out, void* lse, const void* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH,
                               int64_t chunk_rows = 0, bool bf16_products = false);
template <Device D, DType T>
void attention_by_gemm_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse,
                                int64_t B, int64_t T_, int64_t C, int64_t NH, int64_t chunk_rows = 0,
                                bool bf16_products = false);

// The query rows per chunk for these sizes (>= 1; T when the whole score matrix is small).
int64_t attention_chunk_rows(int64_t B, int64_t T, int64_t NH);

}  // namespace paratrain::kernels
