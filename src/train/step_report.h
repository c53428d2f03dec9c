// One optimizer step's figures: this rank's, then every rank's (gather_step_report, collective
// over the world), and the metrics line (DESIGN.md "Metrics") built from them.
//
// Thread-safety: the training thread. Plain values.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/amp/mixed_precision.h"
#include "paratrain/parallel/tensor_parallel/comm_ops.h"
#include "paratrain/tensor/allocator.h"
#include "parallel_model.h"
#include "step_schedule.h"

namespace paratrain::train {

struct StepReport {
  int64_t step = 0;
  double lr = 0, loss = 0, norm = std::numeric_limits<double>::quiet_NaN(), step_s = 0, loss_scale = 1;
  double data_wait_s = 0;
  bool skipped = false;
  long page_faults = 0;
  int64_t host_waits = -1;  // this rank's waits for its GPU during the step (cuda::host_waits); -1 on a CPU
  StepOutcome outcome;
  parallel::TpCommStats tp;
  // Per rank (this rank's alone without a group).
  std::vector<double> step_ms_per_rank, compute_ms_per_rank, busy_ms_per_rank, data_wait_ms_per_rank;
  // The allocator's figures per rank (the GPU's on a GPU): peak since the run's start, in use
  // and reserved at the step's end (torch.cuda's max_memory_allocated, memory_allocated and
  // memory_reserved), and what the forwards left for their backward.
  std::vector<int64_t> peak_per_rank, allocated_per_rank, reserved_per_rank, activation_per_rank;
  double bubble_fraction = -1;  // pipeline: 1 - compute / schedule time over every rank
  nlohmann::json traffic;       // StepTraffic::end() of this rank
};

// The rank whose work (compute + data wait) took longest this step, and by how much it
// exceeded the median rank's (the lower middle one: with two ranks, the other rank), as a
// fraction (0.5 = 50% longer). {-1, 0} for one rank.
struct SlowestRank {
  int rank = -1;
  double lag = 0;
};
SlowestRank slowest_rank(const StepReport& r);

// Fills the per-rank figures from this rank's (`r.loss`: this rank's mean micro-batch loss,
// weighted by `weight`, its share of the global batch) and makes `r.loss` the global batch's
// mean (over the ranks holding the last pipeline stage). Collective over `world` (may be null).
void gather_step_report(StepReport& r, comm::ProcessGroup* world, const parallel::MeshShape& shape, double weight,
                        const AllocatorStats& memory);

// What stays constant over a run and goes into every metrics line.
struct RunFigures {
  std::vector<int64_t> mem_optimizer_per_rank, mem_grad_per_rank, mem_param_per_rank;
  double peak_flops = 0;  // per rank: the f32 FMA peak on a CPU, the measured bf16 GEMM rate on a GPU
  std::string device = "cpu";  // where the run trains ("cpu", "cuda:0": rank 0's); the memory figures are its
  int64_t items_per_step = 0, micro_batch = 0;
  double flops_per_item = 0;  // Task::flops_per_item, or 6 x parameters when the task gives none
  DType compute_dtype = DType::F32;
};

// Fills `run`'s memory per rank as it stays between steps (optimizer state, gradients,
// parameters: ParallelModel::memory_between_steps), gathered over `world` (may be null; then
// this rank's alone). Collective over `world`.
void gather_memory_between_steps(RunFigures& run, ParallelModel& pm, comm::ProcessGroup* world);

nlohmann::json metrics_line(const StepReport& r, const TrainConfig& cfg, ParallelModel& pm,
                            const parallel::DeviceMesh& mesh, Task& task, const amp::MixedPrecision& mp,
                            const RunFigures& run, const std::vector<int64_t>* micro_batch_per_rank);

}  // namespace paratrain::train
