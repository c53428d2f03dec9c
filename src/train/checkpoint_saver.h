// Writing the training state at a step (checkpoint/training_state.h), for any layout.
//
// Unsharded state (no ZeRO, no tensor or pipeline parallelism): rank 0 writes everything.
// Tensor- or pipeline-parallel: the dp-rank-0 rank of each (pipeline stage, tp index) writes
// its part of the model (with its optimizer state unless ZeRO shards it); with ZeRO every
// rank writes its pieces (with its stage and tp index);
// rank 0 gathers their sizes and CRCs and writes the rest and the manifest last. ZeRO 3: no
// rank holds the whole model (or its tensor-parallel part), so every rank's shard carries its
// pieces of the parameters too. A later load gets the whole state, for any layout.
//
// Thread-safety: the training thread; save() is collective over the world.
#pragma once

#include <cstdint>
#include <functional>

#include <nlohmann/json.hpp>

#include "paratrain/amp/mixed_precision.h"
#include "paratrain/checkpoint/training_state.h"
#include "parallel_model.h"

namespace paratrain::train {

class CheckpointSaver {
 public:
  // `before_manifest(step)` runs on every rank once its files of the step are written (the
  // PARATRAIN_TEST_KILL_IN_SAVE hook).
  CheckpointSaver(const TrainConfig& cfg, Task& task, ParallelModel& model, const parallel::DeviceMesh& mesh,
                  amp::MixedPrecision& mp, nlohmann::json run_config, std::function<void(int64_t)> before_manifest);
  void save(int64_t step);

 private:
  checkpoint::TrainingState run_state(int64_t step) const;
  const TrainConfig& cfg_;
  Task& task_;
  ParallelModel& model_;
  const parallel::DeviceMesh& mesh_;
  amp::MixedPrecision& mp_;
  nlohmann::json run_config_;
  std::function<void(int64_t)> before_manifest_;
};

}  // namespace paratrain::train
