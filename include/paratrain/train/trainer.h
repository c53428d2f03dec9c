// The training loop behind `paratrain train`.
//
// train() validates every input (data files, sizes, --init-from) before it writes anything,
// then runs the optimizer steps: for each step, grad_accum micro-batches (taken in the
// DESIGN.md data order), gradients averaged over them, global-norm clipping, the optimizer
// update at the scheduled learning rate. It prints a progress line to stderr, writes a
// metrics line per step (and per evaluation) to --metrics, evaluates every --eval-every
// steps and after the last, and saves the final weights (--save-final, safetensors, written
// atomically). Bad input throws InputError before any file is written.
#pragma once

#include <iosfwd>

#include "paratrain/train/config.h"

namespace paratrain::train {

struct TrainResult {
  int64_t steps = 0;
  double last_loss = 0;
  double val_loss = -1;   // GPT models with --val-data; -1 otherwise
  double accuracy = -1;   // classifiers; -1 otherwise
  double tokens_per_s = 0;   // GPT (global batch)
  double samples_per_s = 0;  // classifiers
  int64_t peak_bytes = 0;    // allocator peak
};

TrainResult train(const TrainConfig& cfg, std::ostream& log);

}  // namespace paratrain::train
