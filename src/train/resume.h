// Where a run resumes: the latest complete checkpoint in --checkpoint-dir, read whole and
// checked against this run's record (run_record.h) before anything is applied; the log says
// what was found (and the interrupted saves passed over). nullopt when there is none.
// InputError when the checkpoint belongs to another run or lies beyond --steps.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/training_state.h"
#include "paratrain/train/config.h"

namespace paratrain::train {

std::optional<checkpoint::TrainingState> find_resume_state(const TrainConfig& cfg, const nlohmann::json& this_run,
                                                           int64_t steps, int world, int64_t restart_count,
                                                           std::ostream& log);

}  // namespace paratrain::train
