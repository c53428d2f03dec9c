// The built-in tasks behind make_builtin_task (task.h): one file each.
#pragma once

#include <memory>

#include "paratrain/train/task.h"

namespace paratrain::train {

std::unique_ptr<Task> make_gpt_task(const TrainConfig& cfg, int64_t micro_batch, int dp, int tp);
std::unique_ptr<Task> make_image_task(const TrainConfig& cfg, int64_t micro_batch, int dp);

}  // namespace paratrain::train
