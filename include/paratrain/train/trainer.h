// The training loop: `paratrain train` and a program's own model run the same code.
//
//   train(cfg, log)        the built-in task cfg names (cfg.model on cfg.data / cfg.dataset);
//   train(cfg, task, log)  a program's own Task (train/task.h), usually a SupervisedTask
//                          (train/supervised_task.h: a Module, a loss function, a Dataset).
//
// Both validate every input (the config, data files, sizes, init_from, the task's setup())
// before writing anything, then run the optimizer steps: for each step, grad_accum
// micro-batches (taken in the DESIGN.md data order), gradients averaged over them and over
// the data-parallel ranks (DDP overlapping the backward, or ZeRO), global-norm clipping, the
// optimizer update at the scheduled learning rate. They print a progress line and a summary
// to `log` (rank 0 only), write a metrics line per step (and per evaluation) to cfg.metrics,
// evaluate every cfg.eval_every steps and after the last when the task has evaluation data,
// save training-state checkpoints to cfg.checkpoint_dir (resume with cfg.resume) and the final
// weights to cfg.save_final (safetensors, written atomically).
//
// Ranks: one process per rank; the job comes from the environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT as `paratrain launch` or torchrun set them, or mpirun/Slurm's).
// Every rank calls train() with the same config and an equal task; the call is collective.
//
// A user's task (train(cfg, task, log)):
//  - applies: the optimizer and schedule fields, micro_batch (0 = 32), grad_accum, steps or
//    epochs (epochs needs Task::steps_per_epoch()), stop_at_step, seed, threads, device,
//    deterministic, precision/loss_scale, backend, dp, bucket_mb, zero 0|1|2, compress,
//    balance, init_from, save_final/save_dtype, eval_every/eval_batches, metrics, quiet,
//    checkpoint_dir/checkpoint_every/resume. lr < 0 means 1e-3 (AdamW) or 0.05 (SGD).
//  - ignored: `model` (the task is named by Task::name()).
//  - refused (InputError): data, val_data, dataset, data_dir, n_layer, n_head, n_embd,
//    block_size, vocab_size, dropout -- the built-in tasks' fields; a task brings its data.
//  - tp or pp > 1, zero 3, recompute and sequence_parallel cut a GPT: InputError unless
//    Task::gpt() returns one.
//
// Errors: InputError (bad config or usage: the messages name the TrainConfig field or the
// task's problem) before any file is written, on every rank that sees it; checks that span
// ranks raise it on every rank: a model whose parameter names, shapes or dtypes differ
// across ranks (naming the first difference), tasks whose training data differ in size.
// A non-finite loss is an Error; a failed peer or a deadline is CommError / TimeoutError.
//
// Thread-safety: one train() call at a time per process (it sets the process's kernel thread
// count and the CPU allocator's peak counter); the calling thread runs the steps, a worker
// thread runs Task::fill. Lifetime: train() keeps no reference to cfg, task or log after it
// returns; the task's model holds the trained weights (on every rank; with ZeRO too).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <vector>

#include "paratrain/train/config.h"

namespace paratrain::train {

class Task;

struct TrainResult {
  int64_t steps = 0;       // the run's total optimizer steps (TrainConfig::steps or from epochs)
  int64_t start_step = 0;  // where this call began (> 0 when it resumed from a checkpoint)
  double last_loss = 0;
  std::vector<double> losses;  // the loss of each step this call ran: steps start_step+1, ...
  double val_loss = -1;   // the last evaluation's, when the task reports one; -1 otherwise
  double accuracy = -1;   // likewise, a fraction in [0, 1]
  double tokens_per_s = 0;   // tasks that count tokens (global batch)
  double samples_per_s = 0;  // the others
  int64_t peak_bytes = 0;    // allocator peak
};

// What on_step sees after each optimizer step, on every rank (the same values everywhere).
struct StepInfo {
  int64_t step = 0;      // steps done, 1-based
  int64_t steps = 0;     // of the run's total
  double loss = 0;       // mean over the global batch
  double lr = 0;
  double grad_norm = 0;  // NaN when the loss scaler skipped the step
  bool skipped = false;
};
using StepCallback = std::function<void(const StepInfo&)>;

// The built-in task cfg names (the `paratrain train` command).
TrainResult train(const TrainConfig& cfg, std::ostream& log);
// A program's own task; `on_step` (optional) runs on the calling thread after every step.
TrainResult train(const TrainConfig& cfg, Task& task, std::ostream& log, const StepCallback& on_step = {});

}  // namespace paratrain::train
