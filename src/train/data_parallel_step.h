// The data-parallel step: the micro-batches one after the other on this rank, each forward
// under autocast and its backward seeded, gradient communication held back (no_sync) until
// the last micro-batch so that it overlaps that backward. On a GPU each batch goes up
// through page-locked memory (an asynchronous copy on the compute stream) and the losses
// stay on the device until the step's end: the host reads them back once per step.
#pragma once

#include "parallel_model.h"
#include "step_schedule.h"

namespace paratrain::train {

class DataParallelStep final : public StepSchedule {
 public:
  // `slowdown` > 1 makes this rank idle (slowdown - 1) x its compute (PARATRAIN_SIMULATE_SLOWDOWN).
  DataParallelStep(Task& task, ParallelModel& model, MicroBatches batches, int64_t grad_accum, DType compute_dtype,
                   autograd::WeightCastCache* half_copies, double slowdown, DeviceSpec device);
  StepOutcome run(int64_t step, const Tensor& seed) override;

 private:
  Task& task_;
  ParallelModel& model_;
  MicroBatches batches_;
  int64_t grad_accum_;
  DType compute_dtype_;
  autograd::WeightCastCache* half_copies_;
  double slowdown_;
  DeviceSpec device_;
  // Compute time of the last micro-step (for the simulated slowdown); on a GPU the last step's
  // mean, measured to its loss read-back.
  double last_micro_s_ = 0;
};

}  // namespace paratrain::train
