// The pipeline step: this rank's stages of the GPT run the step's micro-batches in the order
// of a pipeline schedule (parallel/pipeline/schedule.h, executor.h); every backward inside
// no_sync, so that finish() reduces the accumulated gradients once. Evaluation batches go
// through the stages forward only; the loss is then broadcast from the last stage.
// Device: the stages' parameters' (`device`); the micro-batches go up to it when a step
// starts, and the executor receives activations and gradients there.
#pragma once

#include <memory>
#include <vector>

#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/pipeline/executor.h"
#include "parallel_model.h"
#include "step_schedule.h"

namespace paratrain::train {

class PipelineStep final : public StepSchedule {
 public:
  PipelineStep(nn::GPT& gpt, ParallelModel& model, const parallel::DeviceMesh& mesh, MicroBatches batches,
               const parallel::pipeline::ScheduleSpec& spec, DType compute_dtype, autograd::WeightCastCache* half_copies,
               int64_t micro_batch, DeviceSpec device);
  StepOutcome run(int64_t step, const Tensor& seed) override;
  bool pipelined() const override { return true; }
  Tensor evaluation_loss(const Tensor& inputs, const Tensor& targets) override;
  const parallel::pipeline::Schedule& schedule() const { return executor_.schedule(); }

 private:
  Tensor forward(int chunk, const Tensor& input, const Tensor& targets);
  nn::GPT& gpt_;
  ParallelModel& model_;
  const parallel::DeviceMesh& mesh_;
  MicroBatches batches_;
  DType compute_dtype_;
  DeviceSpec device_;
  autograd::WeightCastCache* half_copies_;
  parallel::pipeline::PipelineExecutor executor_;
  std::vector<Tensor> tokens_, targets_;  // this step's micro-batches
};

}  // namespace paratrain::train
