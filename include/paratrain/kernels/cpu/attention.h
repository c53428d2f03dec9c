// Fused causal self-attention in the Hugging Face GPT-2 layout.
//
// qkv (B,T,3C) is c_attn's output: q, k, v packed along the last dim in that order, each C
// wide; head h uses columns [h*hs, (h+1)*hs) of each (hs = C/NH). out (B,T,C) has the heads
// side by side in the same way (ready for c_proj). Scores are scaled by 1/sqrt(hs), causal
// mask (query t sees keys 0..t), softmax in f32.
//
// Memory: no (T,T) matrix. Work is cut into blocks of query rows (kAttnBlock); each task
// holds one (block x T) score block in reused thread-local scratch. The forward saves the
// row logsumexp lse (B,NH,T); the backward recomputes the scores block by block from it.
// The forward is parallel over (B, NH, row blocks), the backward over (B, NH).
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

constexpr int64_t kAttnBlock = 64;  // query rows per block

// out (B,T,C), lse (B,NH,T), qkv (B,T,3C); C % NH == 0. lse may be nullptr (inference).
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                       int64_t C, int64_t NH);

// dqkv (B,T,3C) += gradient; dout (B,T,C), qkv (B,T,3C), out (B,T,C) and lse (B,NH,T)
// from the forward.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);

}  // namespace paratrain::kernels::cpu
