// Causal self-attention, block-wise (flash-attention style without the (T,T) matrix).
//
// Forward, per task (b, h, block of query rows [i0, i1)), keys 0..i1-1 only (causal):
//   S = scale * Q_blk K^T            (nq x nk)  one small GEMM
//   P = softmax(S) with j > t masked  row by row, lse[t] = max + log(sum) saved
//   O_blk = P V                      (nq x hs)  one small GEMM, straight into out
// Backward, per task (b, h), for each query block (scores recomputed from lse):
//   P = exp(scale * Q_blk K^T - lse), masked
//   dP = dO_blk V^T;  D_t = dO_t . O_t;  dS = P * (dP - D)
//   dQ_blk += scale * dS K;  dK += scale * dS^T Q_blk;  dV += P^T dO_blk
// A (b, h) task owns the dK, dV columns of its head, so the accumulation into dqkv has no
// races. Scratch: two (block x T) arrays per thread, reused across calls.
#include "paratrain/kernels/cpu/attention.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rows.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/gemm.h"

namespace paratrain::kernels::cpu {
namespace {
void check(int64_t B, int64_t T, int64_t C, int64_t NH, const char* who) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    PT_THROW(InputError, who, ": bad sizes B=", B, " T=", T, " C=", C, " NH=", NH,
             " (C must be a positive multiple of NH)");
}
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                       int64_t C, int64_t NH) {
  check(B, T, C, NH, "attention_forward");
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t nblk = (T + kAttnBlock - 1) / kAttnBlock;
  const int64_t ntasks = B * NH * nblk;
  // Largest blocks first (they have the most keys) for better dynamic balance.
  detail::parallel_tasks(ntasks, [&](int64_t task) {
    const int64_t blk = nblk - 1 - task % nblk, bh = task / nblk;
    const int64_t b = bh / NH, h = bh % NH;
    const int64_t i0 = blk * kAttnBlock, i1 = std::min(T, i0 + kAttnBlock);
    const int64_t nq = i1 - i0, nk = i1;
    const float* base = qkv + b * T * C3;
    const float* q = base + i0 * C3 + h * hs;
    const float* k = base + C + h * hs;
    const float* v = base + 2 * C + h * hs;
    float* S = detail::scratch(0, static_cast<size_t>(kAttnBlock * T));
    gemm(false, true, nq, nk, hs, scale, q, C3, k, C3, 0.0f, S, nk);
    for (int64_t r = 0; r < nq; ++r) {
      const int64_t t = i0 + r, nv = t + 1;  // keys 0..t
      float* s = S + r * nk;
      const float m = detail::row_max(s, nv);
      const float sum = detail::row_exp_sum(s, s, nv, m);
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j < nv; ++j) s[j] *= inv;
      for (int64_t j = nv; j < nk; ++j) s[j] = 0.0f;
      if (lse) lse[bh * T + t] = m + std::log(sum);
    }
    gemm(false, false, nq, hs, nk, 1.0f, S, nk, v, C3, 0.0f, out + (b * T + i0) * C + h * hs, C);
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  check(B, T, C, NH, "attention_backward");
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t nblk = (T + kAttnBlock - 1) / kAttnBlock;
  auto head = [&](int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const float* base = qkv + b * T * C3;
    float* dbase = dqkv + b * T * C3;
    const float* k = base + C + h * hs;
    const float* v = base + 2 * C + h * hs;
    float* dk = dbase + C + h * hs;
    float* dv = dbase + 2 * C + h * hs;
    float* P = detail::scratch(0, static_cast<size_t>(kAttnBlock * T));
    float* dP = detail::scratch(1, static_cast<size_t>(kAttnBlock * T));
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t i0 = blk * kAttnBlock, i1 = std::min(T, i0 + kAttnBlock);
      const int64_t nq = i1 - i0, nk = i1;
      const float* q = base + i0 * C3 + h * hs;
      float* dq = dbase + i0 * C3 + h * hs;
      const float* o = out + (b * T + i0) * C + h * hs;
      const float* dO = dout + (b * T + i0) * C + h * hs;
      gemm(false, true, nq, nk, hs, scale, q, C3, k, C3, 0.0f, P, nk);
      gemm(false, true, nq, nk, hs, 1.0f, dO, C, v, C3, 0.0f, dP, nk);
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t t = i0 + r, nv = t + 1;
        float* p = P + r * nk;
        float* dp = dP + r * nk;
        detail::row_exp_sum(p, p, nv, lse[bh * T + t]);
        const float D = detail::row_dot(dO + r * C, o + r * C, hs);
#pragma omp simd
        for (int64_t j = 0; j < nv; ++j) dp[j] = p[j] * (dp[j] - D);
        for (int64_t j = nv; j < nk; ++j) p[j] = dp[j] = 0.0f;
      }
      gemm(false, false, nq, hs, nk, scale, dP, nk, k, C3, 1.0f, dq, C3);
      gemm(true, false, nk, hs, nq, scale, dP, nk, q, C3, 1.0f, dk, C3);
      gemm(true, false, nk, hs, nq, 1.0f, P, nk, dO, C, 1.0f, dv, C3);
    }
  };
  const int64_t nheads = B * NH;
  if (detail::threads_for(nheads, 1) < num_threads() && !omp_in_parallel()) {
    // Fewer heads than threads: heads one by one, each GEMM threaded.
    for (int64_t bh = 0; bh < nheads; ++bh) head(bh);
  } else {
    detail::parallel_tasks(nheads, head);
  }
}

}  // namespace paratrain::kernels::cpu
