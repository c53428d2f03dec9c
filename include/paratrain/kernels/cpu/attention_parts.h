// The pieces of causal self-attention computed with batched GEMMs over every head at once
// (kernels/attention_by_gemm.h, the CUDA attention): head-major f32 copies of q, k, v (and of
// out, dout) and back, and the row passes over one chunk of scores. The CPU versions are the
// reference the CUDA ones are tested against, and let the GEMM formulation itself be tested
// on the CPU against the fused attention (attention.h).
//
// Layouts (legends of attention.h): x (B,T,P*C) is qkv (P = 3: q, k, v side by side, each C
// wide) or out/dout (P = 1); head h of part p is columns [p*C + h*hs, p*C + (h+1)*hs).
// heads (P, B*NH, T, hs) f32, contiguous. A chunk of scores S (B*NH, rows, keys) f32 holds
// the query rows r0 .. r0+rows-1 against keys 0 .. keys-1, keys = r0 + rows (causal: no
// later key is ever needed); query t = r0 + i sees keys j <= t. lse and D are (B*NH, T) f32.
// Thread-safety: pure functions over the caller's buffers; the kernels' thread pool.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

// heads[p][bh][t][:] = x[b][t][p*C + h*hs : ...], widened to f32 (T = float, or the bits of
// bf16 or f16).
void attention_split_heads(float* heads, const float* x, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P);
void attention_split_heads_bf16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P);
void attention_split_heads_f16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P);
// x[b][t][p*C + h*hs + d] = heads[p][bh][t][d], or with `accumulate` x + heads (in f32, rounded
// once to x's type).
void attention_merge_heads(float* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P,
                           bool accumulate);
void attention_merge_heads_bf16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P, bool accumulate);
void attention_merge_heads_f16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P, bool accumulate);
// Forward, in place: row i of each head's chunk becomes the softmax of S[i][0..t] (zeros for
// j > t); lse[bh][t] = max + log(sum), of the scores as they are in S (already scaled).
void attention_chunk_softmax(float* S, float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows);
// Backward, in place: S[i][j] = exp(S[i][j] - lse[bh][t]) for j <= t, else 0 (the forward's P).
void attention_chunk_probs(float* S, const float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows);
// Backward, in place: dP[i][j] = P[i][j] * (dP[i][j] - D[bh][t]) for j <= t, else 0 (dS).
void attention_chunk_dscores(float* dP, const float* P, const float* D, int64_t BH, int64_t T, int64_t r0,
                             int64_t rows);
// D[bh][t] = dO[bh][t][:] . O[bh][t][:] (dO, O head-major (B*NH, T, hs)).
void attention_rowdot(float* D, const float* dO, const float* O, int64_t BH, int64_t T, int64_t hs);

}  // namespace paratrain::kernels::cpu
