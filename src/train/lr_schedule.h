// The learning-rate schedule of a run from its TrainConfig: --lr (default 0.05 for SGD, 6e-4
// for a GPT, 1e-3 otherwise), --min-lr (default lr / 10), --lr-schedule, --warmup-steps, over
// `total_steps`. One definition for `train` and `verify`, so both follow the same curve.
#pragma once

#include <cstdint>

#include "paratrain/optim/optimizer.h"
#include "paratrain/train/config.h"
#include "paratrain/train/task.h"

namespace paratrain::train {

optim::LRSchedule lr_schedule_for(const TrainConfig& cfg, Task& task, int64_t total_steps);

}  // namespace paratrain::train
