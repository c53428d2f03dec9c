// The CPU's attention pieces (kernels/cpu/attention_parts.h): plain loops, parallel over rows
// of (head, query), with the fused attention's row helpers (rows.h) so the row passes round
// as attention.cpp does.
#include "paratrain/kernels/cpu/attention_parts.h"

#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/rows.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels::cpu {
namespace {

// The element type of a buffer of dtype D, read as f32 and written rounded once.
template <DType D>
struct Conv;
template <>
struct Conv<DType::F32> {
  using S = float;
  static float widen(float v) { return v; }
  static float narrow(float v) { return v; }
};
template <>
struct Conv<DType::BF16> {
  using S = uint16_t;
  static float widen(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t narrow(float v) { return f32_to_bf16(v); }
};
template <>
struct Conv<DType::F16> {
  using S = uint16_t;
  static float widen(uint16_t v) { return f16_to_f32(v); }
  static uint16_t narrow(float v) { return f32_to_f16(v); }
};

// Calls f(p, bh, b, h, t) for every row of every part's heads.
template <typename F>
void each_head_row(int64_t B, int64_t T, int64_t NH, int64_t P, F&& f) {
  detail::parallel_for(P * B * NH * T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row % T, bh = (row / T) % (B * NH), p = row / (T * B * NH);
      f(p, bh, bh / NH, bh % NH, t);
    }
  });
}

template <DType D, typename X = typename Conv<D>::S>
void split(float* heads, const X* x, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P) {
  const int64_t hs = C / NH;
  each_head_row(B, T, NH, P, [&](int64_t p, int64_t bh, int64_t b, int64_t h, int64_t t) {
    const X* src = x + (b * T + t) * P * C + p * C + h * hs;
    float* dst = heads + ((p * B * NH + bh) * T + t) * hs;
    for (int64_t d = 0; d < hs; ++d) dst[d] = Conv<D>::widen(src[d]);
  });
}

template <DType D, typename X = typename Conv<D>::S>
void merge(X* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P, bool accumulate) {
  const int64_t hs = C / NH;
  each_head_row(B, T, NH, P, [&](int64_t p, int64_t bh, int64_t b, int64_t h, int64_t t) {
    X* dst = x + (b * T + t) * P * C + p * C + h * hs;
    const float* src = heads + ((p * B * NH + bh) * T + t) * hs;
    for (int64_t d = 0; d < hs; ++d) dst[d] = Conv<D>::narrow(accumulate ? Conv<D>::widen(dst[d]) + src[d] : src[d]);
  });
}

// Calls f(row of the chunk (keys floats), bh, t) for every (head, query row) of the chunk.
template <typename F>
void each_chunk_row(int64_t BH, int64_t r0, int64_t rows, F&& f) {
  detail::parallel_for(BH * rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) f(row, row / rows, r0 + row % rows);
  });
}

}  // namespace

void attention_split_heads(float* heads, const float* x, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P) {
  split<DType::F32>(heads, x, B, T, C, NH, P);
}
void attention_split_heads_bf16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P) {
  split<DType::BF16>(heads, x, B, T, C, NH, P);
}
void attention_split_heads_f16(float* heads, const uint16_t* x, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P) {
  split<DType::F16>(heads, x, B, T, C, NH, P);
}
void attention_merge_heads(float* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t P,
                           bool accumulate) {
  merge<DType::F32>(x, heads, B, T, C, NH, P, accumulate);
}
void attention_merge_heads_bf16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int64_t P, bool accumulate) {
  merge<DType::BF16>(x, heads, B, T, C, NH, P, accumulate);
}
void attention_merge_heads_f16(uint16_t* x, const float* heads, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t P, bool accumulate) {
  merge<DType::F16>(x, heads, B, T, C, NH, P, accumulate);
}

void attention_chunk_softmax(float* S, float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows) {
  const int64_t keys = r0 + rows;
  each_chunk_row(BH, r0, rows, [&](int64_t row, int64_t bh, int64_t t) {
    float* s = S + row * keys;
    const int64_t nv = t + 1;
    const float m = detail::row_max(s, nv);
    const float sum = detail::row_exp_sum(s, s, nv, m);
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < nv; ++j) s[j] *= inv;
    for (int64_t j = nv; j < keys; ++j) s[j] = 0.0f;
    lse[bh * T + t] = m + std::log(sum);
  });
}

void attention_chunk_probs(float* S, const float* lse, int64_t BH, int64_t T, int64_t r0, int64_t rows) {
  const int64_t keys = r0 + rows;
  each_chunk_row(BH, r0, rows, [&](int64_t row, int64_t bh, int64_t t) {
    float* s = S + row * keys;
    detail::row_exp_sum(s, s, t + 1, lse[bh * T + t]);
    for (int64_t j = t + 1; j < keys; ++j) s[j] = 0.0f;
  });
}

void attention_chunk_dscores(float* dP, const float* P, const float* D, int64_t BH, int64_t T, int64_t r0,
                             int64_t rows) {
  const int64_t keys = r0 + rows;
  each_chunk_row(BH, r0, rows, [&](int64_t row, int64_t bh, int64_t t) {
    float* dp = dP + row * keys;
    const float* p = P + row * keys;
    const float d = D[bh * T + t];
    for (int64_t j = 0; j <= t; ++j) dp[j] = p[j] * (dp[j] - d);
    for (int64_t j = t + 1; j < keys; ++j) dp[j] = 0.0f;
  });
}

void attention_rowdot(float* D, const float* dO, const float* O, int64_t BH, int64_t T, int64_t hs) {
  detail::parallel_for(BH * T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) D[row] = detail::row_dot(dO + row * hs, O + row * hs, hs);
  });
}

}  // namespace paratrain::kernels::cpu
