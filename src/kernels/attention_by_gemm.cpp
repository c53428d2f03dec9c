// Attention by batched GEMMs (kernels/attention_by_gemm.h), written once over the dispatch
// tables of the device it runs on.
#include "paratrain/kernels/attention_by_gemm.h"

#include <algorithm>
#include <cmath>

#include "paratrain/base/error.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels {
namespace {

constexpr int64_t kChunkBytes = int64_t{128} << 20;  // one chunk of scores, f32, at most
constexpr int64_t kMaxChunkRows = 128;                 // query rows per chunk, at most

void check(int64_t B, int64_t T, int64_t C, int64_t NH, const char* who) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    PT_THROW(InputError, who, ": bad sizes B=", B, " T=", T, " C=", C, " NH=", NH,
             " (C must be a positive multiple of NH)");
}

// f32 scratch on device D (the current GPU for CUDA), from its caching allocator.
template <Device D>
Tensor scratch(int64_t n) {
  return Tensor::empty({std::max<int64_t>(n, 1)}, DType::F32, D, -1);
}

float* f32(Tensor& t) { return static_cast<float*>(t.data_ptr()); }

// The query chunks [r0, r0 + rows) of T in order.
template <typename F>
void each_chunk(int64_t T, int64_t R, F&& f) {
  for (int64_t r0 = 0; r0 < T; r0 += R) f(r0, std::min(R, T - r0));
}

}  // namespace

int64_t attention_chunk_rows(int64_t B, int64_t T, int64_t NH) {
  const int64_t per_row = std::max<int64_t>(1, B * NH * T * 4);
  int64_t R = std::clamp<int64_t>(kChunkBytes / per_row, 1, kMaxChunkRows);
  if (R >= 16) R -= R % 16;  // whole tiles for the GEMMs
  return std::min(R, std::max<int64_t>(T, 1));
}

namespace {

// The GEMMs of one call: f32 operands into f32 C, or (bf16 products) the operands' bf16
// copies into f32 C. An operand is passed as both: its f32 values and its bf16 copy (null
// in f32 mode), at the same element offsets.
template <Device D>
struct Products {
  bool bf16;
  const Registry& r = registry();
  decltype(r.gemm_batched.at(D, DType::F32)) f32_gemm = r.gemm_batched.at(D, DType::F32);
  decltype(r.gemm_batched.at(D, DType::F32)) to_f32_gemm =
      bf16 ? r.gemm_batched_to_f32.at(D, DType::BF16) : nullptr;

  struct Operand {
    const float* f;
    const uint16_t* h;
    Operand at(int64_t offset) const { return {f + offset, h ? h + offset : nullptr}; }
  };
  // An operand over f32 `f` and its bf16 copy in `h` (an element count apart in bf16 mode).
  Operand operand(const float* f, Tensor& h) const {
    return {f, bf16 ? static_cast<const uint16_t*>(h.data_ptr()) : nullptr};
  }
  // The bf16 copy of n values of `f` into h (bf16 mode only; rounded to nearest even).
  void round(Tensor& h, const float* f, int64_t n) const {
    if (bf16) r.cast_from_f32.at(D, DType::BF16)(h.data_ptr(), f, n);
  }
  // Scratch for the bf16 copy of n values (one element in f32 mode).
  Tensor half_scratch(int64_t n) const { return Tensor::empty({bf16 ? std::max<int64_t>(n, 1) : 1}, DType::BF16, D, -1); }

  void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, Operand A, int64_t lda, Operand B,
          int64_t ldb, float beta, float* C, int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc) const {
    if (bf16) to_f32_gemm(ta, tb, M, N, K, alpha, A.h, lda, B.h, ldb, beta, C, ldc, batch, sa, sb, sc);
    else f32_gemm(ta, tb, M, N, K, alpha, A.f, lda, B.f, ldb, beta, C, ldc, batch, sa, sb, sc);
  }
};

}  // namespace

template <Device D, DType DT>
void attention_by_gemm_forward(void* out, void* lse, const void* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                               int64_t chunk_rows, bool bf16_products) {
  check(B, T, C, NH, "attention_forward");
  if (B == 0 || T == 0) return;
  const Products<D> mm{bf16_products && DT == DType::BF16};
  const Registry& r = registry();
  const int64_t hs = C / NH, BH = B * NH, head = T * hs, R = chunk_rows > 0 ? chunk_rows : attention_chunk_rows(B, T, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor heads = scratch<D>(3 * BH * head), o = scratch<D>(BH * head), S = scratch<D>(BH * R * T);
  Tensor heads16 = mm.half_scratch(3 * BH * head), P16 = mm.half_scratch(BH * R * T);
  Tensor lse_local;  // lse may be null (inference): the softmax still writes one
  float* lse_out = static_cast<float*>(lse);
  if (!lse_out) lse_local = scratch<D>(BH * T), lse_out = f32(lse_local);
  r.attention_split_heads.at(D, DT)(heads.data_ptr(), qkv, B, T, C, NH, 3);
  mm.round(heads16, f32(heads), 3 * BH * head);  // exact: the values came from bf16
  const auto q = mm.operand(f32(heads), heads16), k = q.at(BH * head), v = k.at(BH * head);
  each_chunk(T, R, [&](int64_t r0, int64_t rows) {
    const int64_t keys = r0 + rows;
    mm.mm(false, true, rows, keys, hs, scale, q.at(r0 * hs), hs, k, hs, 0.0f, f32(S), keys, BH, head, head,
          rows * keys);
    r.attention_chunk_softmax.at(D, DType::F32)(f32(S), lse_out, BH, T, r0, rows);
    mm.round(P16, f32(S), BH * rows * keys);
    mm.mm(false, false, rows, hs, keys, 1.0f, mm.operand(f32(S), P16), keys, v, hs, 0.0f, f32(o) + r0 * hs, hs, BH,
          rows * keys, head, head);
  });
  r.attention_merge_heads.at(D, DT)(out, o.data_ptr(), B, T, C, NH, 1, false);
}

template <Device D, DType DT>
void attention_by_gemm_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse,
                                int64_t B, int64_t T, int64_t C, int64_t NH, int64_t chunk_rows, bool bf16_products) {
  check(B, T, C, NH, "attention_backward");
  if (B == 0 || T == 0) return;
  const Products<D> mm{bf16_products && DT == DType::BF16};
  const Registry& r = registry();
  const int64_t hs = C / NH, BH = B * NH, head = T * hs, R = chunk_rows > 0 ? chunk_rows : attention_chunk_rows(B, T, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Tensor heads = scratch<D>(3 * BH * head), grads = scratch<D>(3 * BH * head);
  Tensor dO = scratch<D>(BH * head), O = scratch<D>(BH * head), Dsum = scratch<D>(BH * T);
  Tensor P = scratch<D>(BH * R * T), dS = scratch<D>(BH * R * T);
  Tensor heads16 = mm.half_scratch(3 * BH * head), dO16 = mm.half_scratch(BH * head);
  Tensor P16 = mm.half_scratch(BH * R * T), dS16 = mm.half_scratch(BH * R * T);
  r.attention_split_heads.at(D, DT)(heads.data_ptr(), qkv, B, T, C, NH, 3);
  r.attention_split_heads.at(D, DT)(dO.data_ptr(), dout, B, T, C, NH, 1);
  r.attention_split_heads.at(D, DT)(O.data_ptr(), out, B, T, C, NH, 1);
  mm.round(heads16, f32(heads), 3 * BH * head);
  mm.round(dO16, f32(dO), BH * head);
  r.attention_rowdot.at(D, DType::F32)(f32(Dsum), f32(dO), f32(O), BH, T, hs);
  r.fill.at(D, DType::F32)(grads.data_ptr(), 0.0f, 3 * BH * head);
  const auto q = mm.operand(f32(heads), heads16), k = q.at(BH * head), v = k.at(BH * head);
  const auto dOp = mm.operand(f32(dO), dO16);
  float *dq = f32(grads), *dk = dq + BH * head, *dv = dk + BH * head;
  const float* lse_in = static_cast<const float*>(lse);
  each_chunk(T, R, [&](int64_t r0, int64_t rows) {
    const int64_t keys = r0 + rows, chunk = rows * keys;
    const auto Pp = mm.operand(f32(P), P16), dSp = mm.operand(f32(dS), dS16);
    mm.mm(false, true, rows, keys, hs, scale, q.at(r0 * hs), hs, k, hs, 0.0f, f32(P), keys, BH, head, head, chunk);
    r.attention_chunk_probs.at(D, DType::F32)(f32(P), lse_in, BH, T, r0, rows);
    mm.round(P16, f32(P), BH * chunk);
    mm.mm(true, false, keys, hs, rows, 1.0f, Pp, keys, dOp.at(r0 * hs), hs, 1.0f, dv, hs, BH, chunk, head, head);
    mm.mm(false, true, rows, keys, hs, 1.0f, dOp.at(r0 * hs), hs, v, hs, 0.0f, f32(dS), keys, BH, head, head, chunk);
    r.attention_chunk_dscores.at(D, DType::F32)(f32(dS), f32(P), f32(Dsum), BH, T, r0, rows);
    mm.round(dS16, f32(dS), BH * chunk);
    mm.mm(false, false, rows, hs, keys, scale, dSp, keys, k, hs, 0.0f, dq + r0 * hs, hs, BH, chunk, head, head);
    mm.mm(true, false, keys, hs, rows, scale, dSp, keys, q.at(r0 * hs), hs, 1.0f, dk, hs, BH, chunk, head, head);
  });
  r.attention_merge_heads.at(D, DT)(dqkv, grads.data_ptr(), B, T, C, NH, 3, true);
}

#define PT_ATTENTION_BY_GEMM(D, DT)                                                                              \
  template void attention_by_gemm_forward<D, DT>(void*, void*, const void*, int64_t, int64_t, int64_t, int64_t, \
                                                 int64_t, bool);                                              \
  template void attention_by_gemm_backward<D, DT>(void*, const void*, const void*, const void*, const void*,     \
                                                  int64_t, int64_t, int64_t, int64_t, int64_t, bool);
PT_ATTENTION_BY_GEMM(Device::CPU, DType::F32)
PT_ATTENTION_BY_GEMM(Device::CPU, DType::BF16)
PT_ATTENTION_BY_GEMM(Device::CPU, DType::F16)
PT_ATTENTION_BY_GEMM(Device::CUDA, DType::F32)
PT_ATTENTION_BY_GEMM(Device::CUDA, DType::BF16)
PT_ATTENTION_BY_GEMM(Device::CUDA, DType::F16)
#undef PT_ATTENTION_BY_GEMM

}  // namespace paratrain::kernels
