// Embedding lookups (token and position) and their backward.
//
// Token ids are int32 and must lie in [0,V) (InputError otherwise, checked before any
// write). The backward is deterministic: it is parallel over the C dimension, each thread
// walks the tokens in order, so there are no races and no dependence on thread count.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

// out (N,C), tokens (N), wte (V,C): out[n,:] = wte[tokens[n],:]
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                       int64_t V, int64_t C);
// dwte (V,C) += scatter of dout (N,C) by tokens (N)
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                        int64_t V, int64_t C);

// A vocabulary-parallel table: wte (R,C) holds rows [start, start+R) of a vocabulary of V
// (tensor parallelism; the rows of [V, start+R) are padding). Token ids must lie in [0,V).
// out (N,C): out[n,:] = wte[tokens[n]-start,:] for ids in [start, start+R), 0 for the others
void vocab_embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                             int64_t V, int64_t start, int64_t R, int64_t C);
// dwte (R,C) += scatter of dout (N,C) by the ids in [start, start+R); the others add nothing
void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                              int64_t V, int64_t start, int64_t R, int64_t C);

// out (B,T,C) += wpe (T,C) broadcast over B  (wpe may have more rows; the first T are used)
void positional_add(float* out, const float* wpe, int64_t B, int64_t T, int64_t C);
// dwpe (T,C) += sum over b of dout (B,T,C)
void positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C);

// GPT encoder in one pass: out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T)
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                     int64_t B, int64_t T, int64_t V, int64_t C);
// dwte (V,C) += scatter, dwpe (T,C) += sum over b; dout (B,T,C). Either may be nullptr.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                      int64_t B, int64_t T, int64_t V, int64_t C);

}  // namespace paratrain::kernels::cpu
