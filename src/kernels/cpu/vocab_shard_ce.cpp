// The vocabulary-shard cross-entropy passes on the CPU (kernels/cpu/vocab_shard_ce.h), f32 and
// (widened row by row into per-thread scratch) bf16/f16. Rows are split over the kernel
// threads in contiguous blocks; every row's numbers are computed by one thread in one order,
// so the result does not depend on the thread count. Registered by register_vocab_shard_kernels.
#include "paratrain/kernels/cpu/vocab_shard_ce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/half_util.h"
#include "kernels/cpu/rows.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::kernels::cpu {
namespace {

constexpr int32_t kIgnore = kIgnoreIndex;
constexpr int64_t kGrain = 1 << 15;  // logits per thread at least

// Calls fn(r, buf) for every row r in [0, N); buf is the calling thread's Vl-wide f32 scratch
// when `scratch`, else nullptr. fn must not throw.
template <typename F>
void for_rows(int64_t N, int64_t Vl, bool scratch, F&& fn) {
  if (N <= 0) return;
  const int nt = omp_in_parallel() ? 1
                                   : static_cast<int>(std::clamp<int64_t>(
                                         N * Vl / kGrain, 1, std::max<int64_t>(std::min<int64_t>(num_threads(), N), 1)));
  std::vector<float> bufs(scratch ? static_cast<size_t>(nt) * static_cast<size_t>(Vl) : 0);
  float* base = scratch ? bufs.data() : nullptr;
  if (nt <= 1) {
    for (int64_t r = 0; r < N; ++r) fn(r, base);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < N; ++r) fn(r, base ? base + omp_get_thread_num() * Vl : nullptr);
}

// Row r of (N, Vl) logits as f32: the row itself for f32; for a half type its first `valid`
// columns widened into buf.
const float* f32_row(const float* l, int64_t r, int64_t Vl, int64_t, float*) { return l + r * Vl; }

template <DType T>
struct HalfRows {
  static const float* get(const uint16_t* logits, int64_t r, int64_t Vl, int64_t valid, float* buf) {
    detail::HalfT<T>::widen(buf, logits + r * Vl, valid);
    return buf;
  }
};

template <typename Get, typename In>
void row_max_impl(float* mx, const In* logits, const int32_t* t, int64_t N, int64_t Vl, int64_t valid, bool half,
                  Get get) {
  for_rows(N, Vl, half, [&](int64_t r, float* buf) {
    mx[r] = t[r] == kIgnore ? -std::numeric_limits<float>::infinity()
                            : detail::row_max(get(logits, r, Vl, valid, buf), valid);
  });
}

template <typename Get, typename In>
void exp_sums_impl(float* s, const In* logits, const float* mx, const int32_t* t, int64_t N, int64_t Vl,
                   int64_t valid, int64_t vocab_start, bool half, Get get) {
  for_rows(N, Vl, half, [&](int64_t r, float* buf) {
    if (t[r] == kIgnore) {
      s[r] = s[N + r] = 0.0f;
      return;
    }
    const float* x = get(logits, r, Vl, valid, buf);
    s[r] = detail::row_exp_sum(nullptr, x, valid, mx[r]);
    const int64_t local = static_cast<int64_t>(t[r]) - vocab_start;
    s[N + r] = local >= 0 && local < valid ? x[local] : 0.0f;
  });
}

// dr: where the f32 gradient row goes (the output row for f32, buf for a half type, which
// narrow then rounds into the output row).
template <typename Get, typename In, typename Out, typename Narrow>
void backward_impl(Out* d, const In* logits, const float* lse, float scale, const int32_t* t, int64_t N, int64_t Vl,
                   int64_t valid, int64_t vocab_start, bool half, Get get, Narrow narrow) {
  for_rows(N, Vl, half, [&](int64_t r, float* buf) {
    Out* drow = d + r * Vl;
    if (t[r] == kIgnore) {
      std::memset(drow, 0, static_cast<size_t>(Vl) * sizeof(Out));
      return;
    }
    const float* x = get(logits, r, Vl, valid, buf);  // half: the widened row, overwritten below
    float* dr = half ? buf : reinterpret_cast<float*>(drow);
    detail::row_exp_sum(dr, x, valid, lse[r]);
#pragma omp simd
    for (int64_t c = 0; c < valid; ++c) dr[c] *= scale;
    for (int64_t c = valid; c < Vl; ++c) dr[c] = 0.0f;
    const int64_t local = static_cast<int64_t>(t[r]) - vocab_start;
    if (local >= 0 && local < valid) dr[local] -= scale;
    narrow(drow, dr, Vl);
  });
}

}  // namespace

void vocab_shard_row_max(float* row_max, const float* logits, const int32_t* targets, int64_t N, int64_t Vl,
                         int64_t valid) {
  row_max_impl(row_max, logits, targets, N, Vl, valid, false, f32_row);
}

void vocab_shard_exp_sums(float* sums, const float* logits, const float* row_max, const int32_t* targets, int64_t N,
                          int64_t Vl, int64_t valid, int64_t vocab_start) {
  exp_sums_impl(sums, logits, row_max, targets, N, Vl, valid, vocab_start, false, f32_row);
}

void vocab_shard_losses(float* losses, float* lse, const float* sums, const int32_t* targets, int64_t N,
                        int64_t vocab_size) {
  (void)vocab_size;  // the targets were checked on the host (header)
  for (int64_t r = 0; r < N; ++r) {
    if (targets[r] == kIgnore) {
      losses[r] = 0.0f;
      continue;
    }
    lse[r] += std::log(sums[r]);  // lse = max + log(sum exp(logit - max)), as the f32 kernel
    losses[r] = lse[r] - sums[N + r];
  }
}

void vocab_shard_ce_backward(float* dlogits, const float* logits, const float* lse, const float* scale,
                             const int32_t* targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start) {
  backward_impl(dlogits, logits, lse, *scale, targets, N, Vl, valid, vocab_start, false, f32_row,
                [](float*, const float*, int64_t) {});
}

namespace half {

template <DType T>
void vocab_shard_row_max(float* row_max, const uint16_t* logits, const int32_t* targets, int64_t N, int64_t Vl,
                         int64_t valid) {
  row_max_impl(row_max, logits, targets, N, Vl, valid, true, HalfRows<T>::get);
}

template <DType T>
void vocab_shard_exp_sums(float* sums, const uint16_t* logits, const float* row_max, const int32_t* targets,
                          int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start) {
  exp_sums_impl(sums, logits, row_max, targets, N, Vl, valid, vocab_start, true, HalfRows<T>::get);
}

template <DType T>
void vocab_shard_ce_backward(uint16_t* dlogits, const uint16_t* logits, const float* lse, const float* scale,
                             const int32_t* targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start) {
  backward_impl(dlogits, logits, lse, *scale, targets, N, Vl, valid, vocab_start, true, HalfRows<T>::get,
                [](uint16_t* out, const float* in, int64_t n) { detail::HalfT<T>::narrow(out, in, n); });
}

#define PT_VOCAB_SHARD_HALF(T)                                                                                     \
  template void vocab_shard_row_max<T>(float*, const uint16_t*, const int32_t*, int64_t, int64_t, int64_t);      \
  template void vocab_shard_exp_sums<T>(float*, const uint16_t*, const float*, const int32_t*, int64_t, int64_t, \
                                        int64_t, int64_t);                                                         \
  template void vocab_shard_ce_backward<T>(uint16_t*, const uint16_t*, const float*, const float*, const int32_t*, \
                                           int64_t, int64_t, int64_t, int64_t);
PT_VOCAB_SHARD_HALF(DType::BF16)
PT_VOCAB_SHARD_HALF(DType::F16)
#undef PT_VOCAB_SHARD_HALF

}  // namespace half

void register_vocab_shard_kernels(Registry& r) {
  constexpr Device C = Device::CPU;
  r.vocab_shard_row_max.set(C, DType::F32, erase<&cpu::vocab_shard_row_max>);
  r.vocab_shard_exp_sums.set(C, DType::F32, erase<&cpu::vocab_shard_exp_sums>);
  r.vocab_shard_losses.set(C, DType::F32, erase<&cpu::vocab_shard_losses>);
  r.vocab_shard_ce_backward.set(C, DType::F32, erase<&cpu::vocab_shard_ce_backward>);
#define PT_CPU_HALF(name)                                      \
  r.name.set(C, DType::BF16, erase<&half::name<DType::BF16>>); \
  r.name.set(C, DType::F16, erase<&half::name<DType::F16>>)
  PT_CPU_HALF(vocab_shard_row_max);
  PT_CPU_HALF(vocab_shard_exp_sums);
  PT_CPU_HALF(vocab_shard_ce_backward);
#undef PT_CPU_HALF
}

}  // namespace paratrain::kernels::cpu
