// One optimizer step's micro-batches, run as a schedule: the forward and backward of each of
// the step's grad_accum micro-batches, in the order the layout needs. DataParallelStep runs
// them one after the other (communication overlapped with the last backward); PipelineStep
// runs a pipeline schedule (parallel/pipeline/schedule.h) over the stages. The loop
// (trainer.cpp) is the same for both: zero_grad, run(), finish, norm, step, metrics.
//
// Thread-safety: the training thread only. Lifetime: references outlive the schedule.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "paratrain/autograd/autocast.h"
#include "paratrain/data/prefetcher.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::train {

// Seconds from t0 to now on the steady clock: the step timings of the schedules and the loop.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct StepOutcome {
  double loss_sum = 0;             // sum of the micro-batch losses this rank computed
  bool computes_loss = true;       // false on pipeline ranks without the last stage
  int64_t activation_bytes = 0;    // the most the forwards left allocated for their backward
  double compute_s = 0;            // the step's forwards and backwards, waiting included
  double busy_ms = 0, wall_ms = 0; // pipeline: compute actions and the whole schedule
  double p2p_ms = 0;               // pipeline: time blocked in sends and receives
  int64_t p2p_bytes = 0;
};

// What a schedule needs for each micro-batch k of step `step`.
struct MicroBatches {
  // The prefetched batch (valid until the next call).
  std::function<const data::Batch&(int64_t step, int64_t k)> next;
  // Announces step `step`'s micro-batches to the prefetcher.
  std::function<void(int64_t step)> announce;
};

class StepSchedule {
 public:
  virtual ~StepSchedule() = default;
  // Runs the forwards and backwards of step `step`; `seed` is the backward seed of each
  // micro-batch loss (loss scale x weight / micro-batches). Gradients accumulate in .grad.
  virtual StepOutcome run(int64_t step, const Tensor& seed) = 0;
  // A pipeline's forward of one evaluation batch across the stages (the loss on every stage
  // of the replica); null for a data-parallel step (the task's own loss is used).
  virtual bool pipelined() const { return false; }
  virtual Tensor evaluation_loss(const Tensor& inputs, const Tensor& targets) { return Tensor(); }
};

}  // namespace paratrain::train
