#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/profiler.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/softmax.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::parallel {

namespace {

constexpr const char* kOp = "vocab_parallel_cross_entropy";
constexpr int32_t kIgnore = kernels::cpu::kIgnoreIndex;

// Targets as contiguous i32 (other integer types converted).
Tensor target_ids(const Tensor& t) {
  if (!t.defined()) PT_THROW(InputError, kOp, ": targets are undefined");
  if (t.dtype() == DType::I32) return t.contiguous();
  if (t.dtype() == DType::I64 || t.dtype() == DType::U16 || t.dtype() == DType::U8) return t.to(DType::I32);
  PT_THROW(InputError, kOp, ": targets must be integer token ids, got ", dtype_name(t.dtype()));
}

// Host targets are checked before the first all-reduce (every rank of tp holds the same ones,
// so all throw together); device targets are checked by the loss kernel (a NaN loss).
void check_host_targets(const Tensor& targets, int64_t vocab_size) {
  if (targets.device() != Device::CPU) return;
  const int32_t* t = targets.data<int32_t>();
  for (int64_t r = 0; r < targets.numel(); ++r)
    if (t[r] < kIgnore || t[r] >= vocab_size)
      PT_THROW(InputError, kOp, ": target ", t[r], " at position ", r, " is outside [0, ", vocab_size, ") and not -1");
}

// The forward's passes and all-reduces over N rows of logits Vl apart, of which the first
// `valid` columns are this rank's real vocabulary: the mean (a scalar on the logits' device),
// each row's lse and the count of non-ignored rows (the backward's).
struct ShardForward {
  Tensor mean, lse, count;
};

ShardForward shard_forward(const Tensor& logits, const Tensor& targets, int64_t N, int64_t Vl, int64_t valid,
                           int64_t vocab_start, int64_t vocab_size, TpGroup& tp) {
  const int32_t* t = targets.data<int32_t>();
  // The global max per row (-inf for ignored rows on every rank), then the sums of
  // exp(logit - max) and the target's logit (0 where this rank does not hold it), one
  // all-reduce of both, then lse and the losses; the mean and the count stay on the device.
  Tensor lse = logits.new_empty({N}, DType::F32), sums = logits.new_empty({2 * N}, DType::F32);
  kernels::kernel(&kernels::Registry::vocab_shard_row_max, logits)(lse.data_ptr(), logits.data_ptr(), t, N, Vl,
                                                                     valid);
  tp.allreduce(lse.data_ptr(), static_cast<size_t>(N), DType::F32, comm::ReduceOp::kMax);
  kernels::kernel(&kernels::Registry::vocab_shard_exp_sums, logits)(sums.data_ptr(), logits.data_ptr(),
                                                                      lse.data_ptr(), t, N, Vl, valid, vocab_start);
  tp.allreduce(sums.data_ptr(), static_cast<size_t>(2 * N), DType::F32, comm::ReduceOp::kSum);
  Tensor losses = logits.new_empty({N}, DType::F32);
  kernels::kernel(&kernels::Registry::vocab_shard_losses, losses)(losses.data_ptr(), lse.data_ptr(),
                                                                    sums.data_ptr(), t, N, vocab_size);
  Tensor out = logits.new_empty({}, DType::F32), count = logits.new_empty({1}, DType::I64);
  kernels::kernel(&kernels::Registry::crossentropy_mean, losses)(out.data_ptr(), count.data<int64_t>(),
                                                                   losses.data_ptr(), t, N);
  return {out, lse, count};
}

// This rank's dlogits (N, Vl; 0 in the padding and on ignored rows) from the gradient g of the
// mean (undefined: zeros).
Tensor shard_backward(const Tensor& g, const Tensor& logits, const Tensor& lse, const Tensor& count,
                      const Tensor& targets, int64_t N, int64_t Vl, int64_t valid, int64_t vocab_start) {
  Tensor d = logits.new_empty({N, Vl});
  if (!g.defined()) {
    d.zero_();
    return d;
  }
  const Tensor g0 = g.contiguous();
  Tensor scale = lse.new_empty({1});  // g / count on the device (0 when count is 0)
  kernels::kernel(&kernels::Registry::crossentropy_grad_scale, scale)(scale.data_ptr(), g0.data_ptr(),
                                                                        count.data<int64_t>(), 1);
  kernels::kernel(&kernels::Registry::vocab_shard_ce_backward, d)(d.data_ptr(), logits.data_ptr(), lse.data_ptr(),
                                                                  scale.data_ptr(), targets.data<int32_t>(), N, Vl,
                                                                  valid, vocab_start);
  return d;
}

// The checks both ops make before any communication: targets one per row of `input` (the
// logits, or the head's hidden states: `what`) and on its device, vocab_start and vocab_size
// fitting `columns` per rank.
void check_shard(const char* op, const char* what, const Tensor& input, int64_t N, const Tensor& targets,
                 int64_t columns, int64_t vocab_start, int64_t vocab_size, const TpGroup& tp) {
  if (targets.device_spec() != input.device_spec())
    PT_THROW(InputError, op, ": ", what, " are on ", input.device_spec().str(), " but targets are on ",
             targets.device_spec().str(), " (move the data with Tensor::to)");
  if (targets.numel() != N)
    PT_THROW(InputError, op, ": ", targets.numel(), " targets for ", N, " rows of ", what, " ",
             shape_str(input.shape()));
  if (vocab_start != static_cast<int64_t>(tp.rank()) * columns)
    PT_THROW(InputError, op, ": vocab_start ", vocab_start, " on tp rank ", tp.rank(), " with ", columns,
             " columns per rank; expected ", static_cast<int64_t>(tp.rank()) * columns);
  if (vocab_size < 1 || vocab_size > static_cast<int64_t>(tp.size()) * columns)
    PT_THROW(InputError, op, ": vocab_size ", vocab_size, " does not fit ", tp.size(), " ranks x ", columns,
             " columns (1 to ", static_cast<int64_t>(tp.size()) * columns, ")");
  check_host_targets(targets, vocab_size);
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits_in, const Tensor& targets_in, int64_t vocab_start,
                                    int64_t vocab_size, const std::shared_ptr<TpGroup>& tp) {
  autograd::profiler::OpScope op_scope(kOp, false);
  if (!tp) PT_THROW(InputError, kOp, ": no tensor-parallel group");
  if (!logits_in.defined()) PT_THROW(InputError, kOp, ": logits are undefined");
  if (!dtype_is_float(logits_in.dtype()))
    PT_THROW(InputError, kOp, ": logits must be floating point (f32, bf16, f16), got ", dtype_name(logits_in.dtype()));
  if (logits_in.dim() < 1 || logits_in.size(-1) == 0)
    PT_THROW(InputError, kOp, ": logits ", shape_str(logits_in.shape()), " have no vocabulary columns");
  const Tensor logits = logits_in.contiguous();
  const Tensor targets = target_ids(targets_in);
  const int64_t Vl = logits.size(-1), N = logits.numel() / Vl;
  check_shard(kOp, "logits", logits, N, targets, Vl, vocab_start, vocab_size, *tp);
  const int64_t valid = std::clamp<int64_t>(vocab_size - vocab_start, 0, Vl);  // columns before the padding
  const ShardForward f = shard_forward(logits, targets, N, Vl, valid, vocab_start, vocab_size, *tp);
  Tensor out = f.mean;
  if (autograd::any_requires_grad({&logits_in})) {
    const Tensor saved = logits.detach();
    auto fn = [saved, lse = f.lse, count = f.count, targets, N, Vl, valid, vocab_start](std::vector<Tensor>& g) {
      return std::vector<Tensor>{
          shard_backward(g[0], saved, lse, count, targets, N, Vl, valid, vocab_start).view(saved.shape())};
    };
    autograd::record(std::make_shared<autograd::LambdaNode>(kOp, std::move(fn)), {&logits_in}, {&out});
  }
  return out;
}

Tensor vocab_parallel_linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets_in,
                                           int64_t vocab_start, int64_t vocab_size,
                                           const std::shared_ptr<TpGroup>& tp) {
  constexpr const char* op = "vocab_parallel_linear_cross_entropy";
  if (!tp) PT_THROW(InputError, op, ": no tensor-parallel group");
  if (!hidden.defined() || !weight.defined() || weight.dim() != 2 || weight.size(0) == 0)
    PT_THROW(InputError, op, ": needs hidden states and a 2-D weight (this rank's vocabulary rows)");
  const Tensor targets = target_ids(targets_in);
  const int64_t rows = weight.size(0), C = weight.size(1);
  const int64_t N = hidden.dim() && hidden.size(-1) == C ? hidden.numel() / std::max<int64_t>(C, 1) : -1;
  if (N < 0)
    PT_THROW(InputError, op, ": hidden ", shape_str(hidden.shape()), " does not fit weight ", shape_str(weight.shape()));
  check_shard(op, "hidden states", hidden, N, targets, rows, vocab_start, vocab_size, *tp);
  const int64_t valid = std::clamp<int64_t>(vocab_size - vocab_start, 0, rows);  // rows before the padding
  // The logits' rows are ld >= rows apart: the vocab-shard kernels take ld as the row length,
  // with `valid` (<= rows) real columns and the rest padding, never read.
  ops::LogitsLoss loss;
  loss.name = op;
  loss.forward = [targets, valid, vocab_start, vocab_size, tp](const Tensor& logits, int64_t n, int64_t, int64_t ld) {
    ShardForward f = shard_forward(logits, targets, n, ld, valid, vocab_start, vocab_size, *tp);
    return std::pair<Tensor, std::vector<Tensor>>{f.mean, {f.lse, f.count}};
  };
  loss.backward = [targets, valid, vocab_start](const Tensor& g, const Tensor& logits, const std::vector<Tensor>& kept,
                                                int64_t n, int64_t, int64_t ld) {
    return shard_backward(g, logits, kept[0], kept[1], targets, n, ld, valid, vocab_start);
  };
  return ops::linear_loss(hidden, weight, loss);
}

}  // namespace paratrain::parallel
