// The checks of a TrainConfig that need no file and no rank: sizes, names of choices, and
// combinations that are refused. InputError (one line naming the option) on the first problem.
#pragma once

#include "paratrain/train/config.h"

namespace paratrain::train {

void validate_config(const TrainConfig& c);
// The built-in tasks' checks: a known cfg.model, and what only a GPT model supports.
void validate_builtin_model(const TrainConfig& c);

// Model chunks per pipeline rank: --pp-virtual, or 2 for the interleaved schedule, else 1.
int pipeline_virtual_chunks(const TrainConfig& c);

}  // namespace paratrain::train
