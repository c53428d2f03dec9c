#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/profiler.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/threads.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::parallel {

namespace {

constexpr const char* kOp = "vocab_parallel_cross_entropy";
constexpr int32_t kIgnore = -1;  // kernels::cpu::kIgnoreIndex, as ops::cross_entropy
constexpr int64_t kGrain = 1 << 15;  // logits per thread at least

// Threads for N rows of Vl logits: the kernels' count, at least kGrain logits each; 1 inside
// a parallel region.
int row_threads(int64_t N, int64_t Vl) {
  if (omp_in_parallel()) return 1;
  const int64_t most = std::min<int64_t>(kernels::cpu::num_threads(), N);
  return static_cast<int>(std::clamp<int64_t>(N * Vl / kGrain, 1, std::max<int64_t>(most, 1)));
}

// Calls fn(r, buf) for every row r in [0, N), rows split over threads in contiguous blocks;
// buf is the calling thread's Vl-wide f32 scratch when `scratch`, else nullptr. fn must not
// throw.
template <typename F>
void for_rows(int64_t N, int64_t Vl, bool scratch, F&& fn) {
  if (N <= 0) return;
  const int nt = row_threads(N, Vl);
  Tensor bufs = scratch ? Tensor::empty({nt, Vl}) : Tensor();
  float* base = scratch ? bufs.data<float>() : nullptr;
  if (nt <= 1) {
    for (int64_t r = 0; r < N; ++r) fn(r, base);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t r = 0; r < N; ++r) fn(r, base ? base + omp_get_thread_num() * Vl : nullptr);
}

using CastFn = void (*)(void* out, const void* in, int64_t n);

// The rows of (N, Vl) contiguous logits read as f32: the logits themselves for f32, else the
// first `valid` columns widened into the caller's buffer (the cast kernel of the dtype).
struct Rows {
  const void* data;
  DType dtype;
  int64_t Vl, valid;
  CastFn widen = nullptr;
  Rows(const Tensor& logits, int64_t valid_cols)
      : data(logits.data_ptr()), dtype(logits.dtype()), Vl(logits.size(-1)), valid(valid_cols) {
    if (dtype != DType::F32) widen = kernels::registry().cast_to_f32.at(logits.device(), dtype);
  }
  bool half() const { return dtype != DType::F32; }
  const float* get(int64_t r, float* buf) const {
    if (!half()) return static_cast<const float*>(data) + r * Vl;
    widen(buf, static_cast<const uint16_t*>(data) + r * Vl, valid);
    return buf;
  }
};

// The kernels' vectorised row primitives (kernels/cpu/softmax.h), f32.
float row_max(const float* x, int64_t n) {
  static const auto fn = kernels::registry().softmax_row_max.at(Device::CPU, DType::F32);
  return fn(x, n);
}

float row_exp_sum(float* out, const float* x, int64_t n, float sub) {
  static const auto fn = kernels::registry().softmax_row_exp_sum.at(Device::CPU, DType::F32);
  return fn(out, x, n, sub);
}

// Targets as contiguous i32 (other integer types converted).
Tensor target_ids(const Tensor& t) {
  if (!t.defined()) PT_THROW(InputError, kOp, ": targets are undefined");
  if (t.dtype() == DType::I32) return t.contiguous();
  if (t.dtype() == DType::I64 || t.dtype() == DType::U16 || t.dtype() == DType::U8) return t.to(DType::I32);
  PT_THROW(InputError, kOp, ": targets must be integer token ids, got ", dtype_name(t.dtype()));
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits_in, const Tensor& targets_in, int64_t vocab_start,
                                    int64_t vocab_size, const std::shared_ptr<TpGroup>& tp) {
  autograd::profiler::OpScope op_scope(kOp, false);
  if (!tp) PT_THROW(InputError, kOp, ": no tensor-parallel group");
  if (!logits_in.defined()) PT_THROW(InputError, kOp, ": logits are undefined");
  if (!dtype_is_float(logits_in.dtype()))
    PT_THROW(InputError, kOp, ": logits must be floating point (f32, bf16, f16), got ", dtype_name(logits_in.dtype()));
  if (logits_in.device() != Device::CPU)
    PT_THROW(InputError, kOp, ": logits on ", device_name(logits_in.device()), "; only CPU tensors are supported");
  if (logits_in.dim() < 1 || logits_in.size(-1) == 0)
    PT_THROW(InputError, kOp, ": logits ", shape_str(logits_in.shape()), " have no vocabulary columns");
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = target_ids(targets_in);
  const int64_t Vl = logits.size(-1), N = logits.numel() / Vl;
  if (targets.numel() != N)
    PT_THROW(InputError, kOp, ": ", targets.numel(), " targets for ", N, " rows of logits ", shape_str(logits.shape()));
  if (vocab_start != static_cast<int64_t>(tp->rank()) * Vl)
    PT_THROW(InputError, kOp, ": vocab_start ", vocab_start, " on tp rank ", tp->rank(), " with ", Vl,
             " columns per rank; expected ", static_cast<int64_t>(tp->rank()) * Vl);
  if (vocab_size < 1 || vocab_size > static_cast<int64_t>(tp->size()) * Vl)
    PT_THROW(InputError, kOp, ": vocab_size ", vocab_size, " does not fit ", tp->size(), " ranks x ", Vl,
             " columns (1 to ", static_cast<int64_t>(tp->size()) * Vl, ")");
  const int32_t* t = targets.data<int32_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < N; ++r) {
    if (t[r] == kIgnore) continue;
    if (t[r] < kIgnore || t[r] >= vocab_size)
      PT_THROW(InputError, kOp, ": target ", t[r], " at position ", r, " is outside [0, ", vocab_size, ") and not -1");
    ++count;
  }
  const int64_t valid = std::clamp<int64_t>(vocab_size - vocab_start, 0, Vl);  // columns before the padding
  const Rows rows(logits, valid);

  // Global max per row (ignored rows: -inf on every rank, unused).
  Tensor lse = Tensor::empty({N}), sums = Tensor::empty({2 * N});
  float* mx = lse.data<float>();  // the max, then the log-sum-exp in place
  float* s = sums.data<float>();  // [sum of exp (N) | target logit (N)]
  for_rows(N, Vl, rows.half(), [&](int64_t r, float* buf) {
    mx[r] = t[r] == kIgnore ? -std::numeric_limits<float>::infinity() : row_max(rows.get(r, buf), valid);
  });
  tp->allreduce(mx, static_cast<size_t>(N), DType::F32, comm::ReduceOp::kMax);

  // Sum of exp(logit - max) and the target's logit (0 where this rank does not hold it), then
  // one all-reduce of both.
  for_rows(N, Vl, rows.half(), [&](int64_t r, float* buf) {
    if (t[r] == kIgnore) {
      s[r] = s[N + r] = 0.0f;
      return;
    }
    const float* x = rows.get(r, buf);
    s[r] = row_exp_sum(nullptr, x, valid, mx[r]);
    const int64_t local = static_cast<int64_t>(t[r]) - vocab_start;
    s[N + r] = local >= 0 && local < valid ? x[local] : 0.0f;
  });
  tp->allreduce(s, static_cast<size_t>(2 * N), DType::F32, comm::ReduceOp::kSum);

  Tensor losses = Tensor::empty({N});
  float* loss = losses.data<float>();
  for (int64_t r = 0; r < N; ++r) {
    if (t[r] == kIgnore) {
      loss[r] = 0.0f;
      continue;
    }
    mx[r] += std::log(s[r]);  // lse = max + log(sum exp(logit - max)), as the f32 kernel
    loss[r] = mx[r] - s[N + r];
  }
  const double total = kernels::kernel(&kernels::Registry::sum, losses)(loss, N);
  Tensor out = Tensor::full({}, count ? total / static_cast<double>(count) : 0.0);

  if (autograd::any_requires_grad({&logits_in})) {
    const Tensor saved = logits.detach();
    const Shape shape = logits.shape();
    const DType dt = logits.dtype();
    auto fn = [saved, lse, targets, shape, dt, N, Vl, valid, vocab_start, count](std::vector<Tensor>& g) {
      Tensor d = Tensor::empty(shape, dt);
      if (!g[0].defined() || count == 0) {
        d.zero_();
        return std::vector<Tensor>{d};
      }
      const float scale = static_cast<float>(g[0].item() / static_cast<double>(count));
      const Rows rows(saved, valid);
      const CastFn narrow = rows.half() ? kernels::registry().cast_from_f32.at(d.device(), dt) : nullptr;
      const int32_t* t = targets.data<int32_t>();
      const float* lse_p = lse.data<float>();
      const size_t esz = dtype_size(dt);
      char* dbase = static_cast<char*>(d.data_ptr());
      for_rows(N, Vl, rows.half(), [&](int64_t r, float* buf) {
        char* drow = dbase + static_cast<size_t>(r * Vl) * esz;
        if (t[r] == kIgnore) {
          std::memset(drow, 0, static_cast<size_t>(Vl) * esz);
          return;
        }
        const float* x = rows.get(r, buf);  // half: the widened row, overwritten in place below
        float* dr = rows.half() ? buf : reinterpret_cast<float*>(drow);
        const float l = lse_p[r];
        row_exp_sum(dr, x, valid, l);
#pragma omp simd
        for (int64_t c = 0; c < valid; ++c) dr[c] *= scale;
        for (int64_t c = valid; c < Vl; ++c) dr[c] = 0.0f;
        const int64_t local = static_cast<int64_t>(t[r]) - vocab_start;
        if (local >= 0 && local < valid) dr[local] -= scale;
        if (narrow) narrow(drow, buf, Vl);
      });
      return std::vector<Tensor>{d};
    };
    autograd::record(std::make_shared<autograd::LambdaNode>(kOp, std::move(fn)), {&logits_in}, {&out});
  }
  return out;
}

}  // namespace paratrain::parallel
