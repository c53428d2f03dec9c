// The run's record in a checkpoint (run_config) and the checks a resume makes: the same
// arithmetic settings and global batch (check_resume_config), every rank at the same step
// (check_ranks_start_at_the_same_step); the warning about interrupted saves it passes over.
// Pure functions except the collective check.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/training_state.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/parallel/mesh.h"
#include "paratrain/train/config.h"

namespace paratrain::train {

// `model`: the task's name (Task::name(); the built-in tasks': cfg.model).
nlohmann::json run_config(const TrainConfig& c, const std::string& model, int64_t micro_batch,
                          const parallel::MeshShape& mesh, int64_t steps, double lr);
void check_resume_config(const std::string& ckpt, const nlohmann::json& saved, const nlohmann::json& now);
std::string ignored_checkpoints_warning(const checkpoint::ResumePoint& p);
void check_ranks_start_at_the_same_step(comm::ProcessGroup& pg, int64_t start_step, const std::string& dir);

}  // namespace paratrain::train
