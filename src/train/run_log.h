// The lines a run starts with (on rank 0's log): the model, the steps and global batch, the
// threads and ranks, the layout; the pipeline's stages; ZeRO's memory per rank; what
// --compress sends.
#pragma once

#include <cstdint>
#include <ostream>

#include "parallel_model.h"

namespace paratrain::train {

void log_run_header(std::ostream& log, const TrainConfig& cfg, const Task& task, ParallelModel& pm,
                    const parallel::DeviceMesh& mesh, int64_t steps, int64_t micro_batch);

}  // namespace paratrain::train
