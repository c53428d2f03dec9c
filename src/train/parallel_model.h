// The model as the run lays it out: cut by tensor parallelism, cut into this rank's pipeline
// stage, wrapped for data parallelism (DDP, ZeRO 1/2 or ZeRO 3), with its optimizer. The step
// schedules and the loop talk to it instead of to those mechanisms one by one.
//
// One optimizer step: zero_grad(); the schedule runs the micro-batches' forwards and
// backwards (inside no_sync() where finish() must do the reduction); finish() (the gradient
// mean over data-parallel ranks, the tied head's copies summed over the first and last
// pipeline stage); grad_norm(); clip_and_step().
//
// Thread-safety: the training thread only. Lifetime: holds references to the task's model
// and the mesh, which outlive it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/nn/module.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/ddp.h"
#include "paratrain/parallel/fsdp.h"
#include "paratrain/parallel/mesh.h"
#include "paratrain/parallel/pipeline/partition.h"
#include "paratrain/parallel/pipeline/stage_model.h"
#include "paratrain/parallel/tensor_parallel/gpt_plan.h"
#include "paratrain/parallel/zero.h"
#include "paratrain/train/config.h"
#include "paratrain/train/task.h"
#include "reduction_hook.h"

namespace paratrain::train {

class ParallelModel {
 public:
  // Collective over the mesh. `lr` is the optimizer's initial learning rate.
  ParallelModel(const TrainConfig& cfg, Task& task, const parallel::DeviceMesh& mesh, double lr, int64_t micro_batch);

  nn::Module& module() { return model_; }
  const parallel::DeviceMesh& mesh() const { return mesh_; }
  const parallel::TensorParallelPlan& plan() const { return plan_; }
  parallel::DistributedDataParallel* ddp() { return ddp_.get(); }
  parallel::FullyShardedDataParallel* fsdp() { return fsdp_.get(); }
  parallel::ZeroOptimizer* zero() { return zero_.get(); }
  optim::Optimizer& optimizer() { return *opt_; }
  // Every parameter this rank holds, and those the optimizer updates (ZeRO: its pieces).
  const optim::NamedParams& params() const { return params_; }
  const optim::NamedParams& optimizer_params() const { return opt_params_; }

  // ---- pipeline parallelism (one chunk covering every block without it) ----
  bool pipelined() const { return mesh_.shape().pp > 1; }
  const std::vector<parallel::pipeline::StageRange>& chunks() const { return chunks_; }
  const std::vector<parallel::pipeline::StageRange>& all_stages() const { return all_stages_; }
  bool holds_last_stage() const { return holds_last_; }

  void zero_grad();
  // The seed of a micro-batch loss's backward: 1/grad_accum, or 1 when finish() divides.
  float backward_seed(int64_t grad_accum) const;
  // No gradient communication while the scope lives (empty without DDP/ZeRO 3).
  std::optional<parallel::NoSyncScope> no_sync();
  // After the step's last backward: every gradient is the global mean (ZeRO: this rank's
  // shard of it).
  void finish();
  // The global gradient norm over every rank's gradients (each element counted once).
  double grad_norm();
  void clip_and_step(double max_norm, double norm);
  // Per rank, between steps: optimizer state, gradient and parameter bytes.
  void memory_between_steps(int64_t out[3]) const;

  // The whole model's weights (gathered over tp and pp; collective), on pp stage 0 (others:
  // their own part).
  std::map<std::string, Tensor> whole_weights();

 private:
  void sum_tied_gradient();
  nn::Module& model_;
  const parallel::DeviceMesh& mesh_;
  parallel::TensorParallelPlan plan_;
  std::vector<parallel::pipeline::StageRange> chunks_, all_stages_;
  bool holds_last_ = true;
  parallel::pipeline::TiedHeadGroup tied_;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp_;
  optim::NamedParams params_, opt_params_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<parallel::ZeroOptimizer> zero_;
  std::optional<BreakReduction> break_reduction_;  // PARATRAIN_TEST_BREAK_REDUCTION
  int64_t finished_steps_ = 0;
};

}  // namespace paratrain::train
