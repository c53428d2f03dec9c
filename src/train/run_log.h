// What a run writes to rank 0's log: the lines it starts with (the model, the steps and global
// batch, the threads and ranks, the layout; the pipeline's stages; ZeRO's memory per rank; what
// --compress sends), each step's progress line, and --balance auto's changes.
//
// Thread-safety: the training thread. Pure formatting: nothing here waits or communicates.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "parallel_model.h"
#include "step_report.h"

namespace paratrain::train {

void log_run_header(std::ostream& log, const TrainConfig& cfg, const Task& task, ParallelModel& pm,
                    const parallel::DeviceMesh& mesh, int64_t steps, int64_t micro_batch);

// The run-wide figures a step's progress line shows beside the step's own (StepReport).
struct ProgressFigures {
  int64_t steps = 0;          // of the whole run
  double rate = 0;            // items per second over the timed steps
  bool counts_tokens = true;  // "tok/s", else "samples/s"
  double eta_s = 0;
  double mfu = -1;            // shown when >= 0 (on a GPU: against its measured bf16 peak)
  bool loss_scaling = false;  // the loss scale is shown (and whether the step was skipped)
  double slow_rank_lag = 0;   // a rank lagging more than this (a fraction) is named
};

// "step 12/100 | loss 3.4567 | lr 3.00e-04 | 91234 tok/s | ETA 1m 2s", then what applies:
// " | MFU 41.2%", " | scale 65536 (skipped)", " | dp 1 x tp 2 x pp 2, tp comm 1.2 ms, 1f1b bubble 0.25",
// " | slowest rank 1 (+38% compute+data)".
std::string step_progress_text(const StepReport& r, const ProgressFigures& f, const TrainConfig& cfg,
                               const ParallelModel& pm);

// "balance: from step S micro-batches per rank [a, b] (measured compute ms per rank last step
// [x, y])": --balance auto's new sizes, which apply from 0-based step `from_step`.
void log_balance_change(std::ostream& log, int64_t from_step, const std::vector<int64_t>& sizes,
                        const StepReport& r);

}  // namespace paratrain::train
