// The checks train(cfg, task, log) makes of a program's own Task before the first step, and
// of every task's loss at each micro-batch: InputError with a message in the library's terms
// (TrainConfig fields, Task members), on every rank that sees the problem. check_tasks_agree
// is collective over the world and raises it on every rank.
#pragma once

#include <string>

#include "paratrain/comm/process_group.h"
#include "paratrain/parallel/mesh.h"
#include "paratrain/tensor/tensor.h"
#include "paratrain/train/config.h"
#include "paratrain/train/task.h"

namespace paratrain::train {

// The built-in tasks' fields (data, val_data, dataset, data_dir, sizes, dropout) are refused
// for a program's own task: it brings its data and model.
void refuse_builtin_fields(const TrainConfig& cfg);
// Tensor or pipeline parallelism, ZeRO 3, recompute and sequence parallelism need a GPT
// (Task::gpt()).
void check_task_supports(const TrainConfig& cfg, const parallel::MeshShape& shape, Task& task);
// The model has parameters that require gradients.
void check_trainable(Task& task);
// Every rank's task has the same training data size and steps per epoch (a different
// dataset on one rank would silently train on other examples).
void check_tasks_agree(comm::ProcessGroup& world, Task& task);
// `loss` (Task::loss of a micro-batch) is a defined one-element tensor that depends on the
// parameters.
void check_loss(const Tensor& loss, const Task& task);

}  // namespace paratrain::train
