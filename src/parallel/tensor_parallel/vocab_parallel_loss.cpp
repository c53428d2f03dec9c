#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"

#include <algorithm>

#include "paratrain/autograd/engine.h"
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
  if (targets.device_spec() != logits.device_spec())
    PT_THROW(InputError, kOp, ": logits are on ", logits.device_spec().str(), " but targets are on ",
             targets.device_spec().str(), " (move the data with Tensor::to)");
  const int64_t Vl = logits.size(-1), N = logits.numel() / Vl;
  if (targets.numel() != N)
    PT_THROW(InputError, kOp, ": ", targets.numel(), " targets for ", N, " rows of logits ", shape_str(logits.shape()));
  if (vocab_start != static_cast<int64_t>(tp->rank()) * Vl)
    PT_THROW(InputError, kOp, ": vocab_start ", vocab_start, " on tp rank ", tp->rank(), " with ", Vl,
             " columns per rank; expected ", static_cast<int64_t>(tp->rank()) * Vl);
  if (vocab_size < 1 || vocab_size > static_cast<int64_t>(tp->size()) * Vl)
    PT_THROW(InputError, kOp, ": vocab_size ", vocab_size, " does not fit ", tp->size(), " ranks x ", Vl,
             " columns (1 to ", static_cast<int64_t>(tp->size()) * Vl, ")");
  check_host_targets(targets, vocab_size);
  const int64_t valid = std::clamp<int64_t>(vocab_size - vocab_start, 0, Vl);  // columns before the padding
  const int32_t* t = targets.data<int32_t>();

  // The global max per row (-inf for ignored rows on every rank), then the sums of
  // exp(logit - max) and the target's logit (0 where this rank does not hold it), one
  // all-reduce of both, then lse and the losses; the mean and the count stay on the device.
  Tensor lse = logits.new_empty({N}, DType::F32), sums = logits.new_empty({2 * N}, DType::F32);
  kernels::kernel(&kernels::Registry::vocab_shard_row_max, logits)(lse.data_ptr(), logits.data_ptr(), t, N, Vl,
                                                                     valid);
  tp->allreduce(lse.data_ptr(), static_cast<size_t>(N), DType::F32, comm::ReduceOp::kMax);
  kernels::kernel(&kernels::Registry::vocab_shard_exp_sums, logits)(sums.data_ptr(), logits.data_ptr(),
                                                                      lse.data_ptr(), t, N, Vl, valid, vocab_start);
  tp->allreduce(sums.data_ptr(), static_cast<size_t>(2 * N), DType::F32, comm::ReduceOp::kSum);
  Tensor losses = logits.new_empty({N}, DType::F32);
  kernels::kernel(&kernels::Registry::vocab_shard_losses, losses)(losses.data_ptr(), lse.data_ptr(),
                                                                    sums.data_ptr(), t, N, vocab_size);
  Tensor out = logits.new_empty({}, DType::F32), count = logits.new_empty({1}, DType::I64);
  kernels::kernel(&kernels::Registry::crossentropy_mean, losses)(out.data_ptr(), count.data<int64_t>(),
                                                                   losses.data_ptr(), t, N);

  if (autograd::any_requires_grad({&logits_in})) {
    const Tensor saved = logits.detach();
    auto fn = [saved, lse, targets, count, N, Vl, valid, vocab_start](std::vector<Tensor>& g) {
      Tensor d = saved.new_empty(saved.shape());
      if (!g[0].defined()) {
        d.zero_();
        return std::vector<Tensor>{d};
      }
      const Tensor g0 = g[0].contiguous();
      Tensor scale = lse.new_empty({1});  // g / count on the device (0 when count is 0)
      kernels::kernel(&kernels::Registry::crossentropy_grad_scale, scale)(scale.data_ptr(), g0.data_ptr(),
                                                                            count.data<int64_t>(), 1);
      kernels::kernel(&kernels::Registry::vocab_shard_ce_backward, d)(d.data_ptr(), saved.data_ptr(), lse.data_ptr(),
                                                                      scale.data_ptr(), targets.data<int32_t>(), N,
                                                                      Vl, valid, vocab_start);
      return std::vector<Tensor>{d};
    };
    autograd::record(std::make_shared<autograd::LambdaNode>(kOp, std::move(fn)), {&logits_in}, {&out});
  }
  return out;
}

}  // namespace paratrain::parallel
