#include "data_parallel_step.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/kernels/tensor_reduce.h"
#include "device_placement.h"
#include "task_checks.h"
#include "paratrain/tensor/allocator.h"

namespace paratrain::train {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

DataParallelStep::DataParallelStep(Task& task, ParallelModel& model, MicroBatches batches, int64_t grad_accum,
                                   DType compute_dtype, autograd::WeightCastCache* half_copies, double slowdown,
                                   DeviceSpec device)
    : task_(task),
      model_(model),
      batches_(std::move(batches)),
      grad_accum_(grad_accum),
      compute_dtype_(compute_dtype),
      half_copies_(half_copies),
      slowdown_(slowdown),
      device_(device) {}

StepOutcome DataParallelStep::run(int64_t step, const Tensor& seed) {
  StepOutcome out;
  Allocator& alloc = memory_of(device_);
  std::vector<Tensor> losses;  // read back once, after the last micro-batch
  losses.reserve(static_cast<size_t>(grad_accum_));
  const auto t0 = Clock::now();
  double slept_s = 0;
  for (int64_t k = 0; k < grad_accum_; ++k) {
    const bool last = k + 1 == grad_accum_;
    std::optional<parallel::NoSyncScope> no_sync = last ? std::nullopt : model_.no_sync();
    if (k == 0) batches_.announce(step + 1);
    const auto t_micro = Clock::now();
    const data::Batch& batch = batches_.next(step, k);
    Tensor loss;
    const int64_t in_use_before_forward = alloc.stats().bytes_in_use;
    {
      autograd::AutocastGuard autocast(compute_dtype_, half_copies_);
      loss = task_.loss(upload(batch.inputs, device_), upload(batch.targets, device_));
    }
    check_loss(loss, task_);  // a scalar with a gradient, else InputError naming the task
    // What the forward left allocated: the activations saved for backward (on the very first
    // step also the parameters' half copies, made then and kept).
    out.activation_bytes = std::max(out.activation_bytes, alloc.stats().bytes_in_use - in_use_before_forward);
    losses.push_back(loss.detach());
    const double forward_s = seconds_since(t_micro);
    // A simulated slow device is slow before its gradients exist: idle (F-1) x the last
    // micro-step's compute time (3 x this forward's at the very first) before backward.
    if (slowdown_ > 1.0) {
      const auto t_sleep = Clock::now();
      std::this_thread::sleep_for(
          std::chrono::duration<double>((slowdown_ - 1.0) * (last_micro_s_ > 0 ? last_micro_s_ : 3.0 * forward_s)));
      slept_s += seconds_since(t_sleep);
    }
    const auto t_backward = Clock::now();
    autograd::backward(loss, seed);
    last_micro_s_ = forward_s + seconds_since(t_backward);
  }
  // The host's one wait for the step's work on a GPU (one copy of every micro-batch's loss);
  // summed in micro-batch order, as they were made.
  for (double l : kernels::values_of(losses)) out.loss_sum += l;
  out.compute_s = seconds_since(t0);
  // On a GPU the host only enqueues: the micro-step's compute is what the step waited for,
  // less the simulated idling, per micro-batch.
  if (device_.kind != Device::CPU)
    last_micro_s_ = std::max(0.0, out.compute_s - slept_s) / static_cast<double>(grad_accum_);
  return out;
}

}  // namespace paratrain::train
