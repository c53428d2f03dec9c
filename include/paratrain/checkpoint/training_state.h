// Training-state checkpoints: everything a training run needs to continue bit-identically
// after it was stopped (docs/checkpoints.md, "Training-state checkpoints").
//
// On disk, under a checkpoint directory D:
//   D/step_<N>/model.safetensors   model weights (the Module's state_dict)
//   D/step_<N>/optim.safetensors   optimizer state ("<param>.exp_avg", ... ; step count in
//                                  its metadata too)
//   D/step_<N>/manifest.json       written LAST: step, world size, the run's configuration,
//                                  optimizer step count, RNG state, loss scale, and the size
//                                  and CRC32 of each file. A step_<N> without a manifest is
//                                  incomplete.
//   D/latest                       "step_<N>\n", written after the manifest.
// Every file is written atomically (base/atomic_file.h), so a kill at any moment leaves
// either the previous checkpoint as `latest` or the new one, never a torn file.
//
// No state is sharded yet: the same files serve any number of data-parallel ranks; only
// rank 0 calls save_training_state().
//
// Thread-safety: free functions, no shared state; two processes must not save into the same
// directory at once.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::checkpoint {

struct TrainingState {
  int64_t step = 0;                           // optimizer steps completed = next step index
  std::map<std::string, Tensor> model;        // model weights
  Metadata model_metadata;                    // __metadata__ of model.safetensors
  std::map<std::string, Tensor> optimizer;    // optimizer state tensors
  int64_t optimizer_steps = 0;                // Optimizer::steps_taken()
  std::optional<std::array<uint64_t, 4>> rng; // dropout Generator state, when the run has one
  double loss_scale = 1.0;
  int world_size = 1;
  // The run's configuration (free-form JSON object the caller builds and compares; the
  // trainer records the data layout micro_batch/grad_accum/dp/seed and every setting that
  // changes the arithmetic).
  nlohmann::json config = nlohmann::json::object();
};

// Directory name of the checkpoint of step N: "step_<N>".
std::string checkpoint_name(int64_t step);

// Writes D/step_<N>/ (N = state.step) and then D/latest, creating D when missing. A leftover
// step_<N> that is not the current `latest` (e.g. half-written before a kill) is replaced;
// if step_<N> already is `latest`, it is complete and identical, and nothing is written.
// Afterwards keeps the newest `keep_last` complete checkpoints and deletes older step_*
// directories. Returns the checkpoint's path. IoError on write failures.
std::string save_training_state(const std::string& dir, const TrainingState& state, int keep_last = 2);

// The checkpoint a resume should load, or nullopt when D holds none (D missing, empty, or
// without step_* directories). It is the one D/latest names, unless a newer step_* has a
// manifest (a kill between the manifest and the `latest` update); without D/latest, the
// newest step_* that has a manifest. InputError when D/latest is unreadable or names a missing
// directory, or when step_* directories exist but none is complete (the error names them).
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// Checks a checkpoint directory without loading tensors: manifest present and well-formed,
// every listed file present with the recorded size and CRC32. InputError naming the
// checkpoint and the file otherwise ("incomplete" when the manifest is missing, "damaged"
// on a size or checksum mismatch).
void verify_training_state(const std::string& ckpt_dir);

// verify_training_state(), then reads everything into a TrainingState (nothing is applied to
// any model or optimizer here, so a bad checkpoint is never half-loaded).
TrainingState load_training_state(const std::string& ckpt_dir);

// CRC32 (zlib) of a file's bytes, as 8 lower-case hex digits; IoError if unreadable.
std::string file_crc32(const std::string& path);

}  // namespace paratrain::checkpoint
