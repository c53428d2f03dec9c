// validate_config: every flag-level check of a TrainConfig, before anything is read or written;
// validate_builtin_model: those that concern the built-in models' names.
#include "config_check.h"

#include "paratrain/amp/mixed_precision.h"
#include "paratrain/base/error.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/pipeline/schedule.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/device.h"
#include "paratrain/train/task.h"

namespace paratrain::train {

void validate_config(const TrainConfig& c) {
  const DeviceSpec device = parse_device(c.device);  // InputError naming the text
  if (device.kind == Device::CUDA) {
    if (!cuda::built())
      PT_THROW(InputError, "--device ", c.device, " is not available: this build of paratrain has no CUDA support");
    if (cuda::device_count() == 0)
      PT_THROW(InputError, "--device ", c.device, " is not available: ", cuda::unavailable_reason());
  }
  if (c.grad_accum < 1) PT_THROW(InputError, "--grad-accum must be at least 1, got ", c.grad_accum);
  if (c.micro_batch < 0) PT_THROW(InputError, "--micro-batch must be positive, got ", c.micro_batch);
  if (c.steps < 0) PT_THROW(InputError, "--steps must not be negative, got ", c.steps);
  if (c.epochs < 0) PT_THROW(InputError, "--epochs must not be negative, got ", c.epochs);
  if (c.stop_at_step < 0) PT_THROW(InputError, "stop_at_step must not be negative (0 = at the last step), got ", c.stop_at_step);
  if (c.optimizer != "adamw" && c.optimizer != "sgd")
    PT_THROW(InputError, "unknown --optimizer '", c.optimizer, "' (expected adamw or sgd)");
  optim::LRSchedule::parse(c.lr_schedule);
  if (c.warmup_steps < 0) PT_THROW(InputError, "--warmup-steps must not be negative");
  if (c.grad_clip < 0) PT_THROW(InputError, "--grad-clip must not be negative (0 = off)");
  if (c.threads < 0) PT_THROW(InputError, "--threads must be positive (0 = automatic)");
  if (c.backend != "auto" && c.backend != "shm" && c.backend != "tcp" && c.backend != "mpi" && c.backend != "nccl")
    PT_THROW(InputError, "unknown --backend '", c.backend, "' (expected auto, shm, tcp, mpi or nccl)");
  if (c.backend == "nccl" && device.kind == Device::CPU)
    PT_THROW(InputError, "--backend nccl moves GPU buffers: it needs --device cuda");
  parallel::pipeline::parse_schedule(c.pp_schedule);  // InputError naming the choices
  if (c.pp_virtual < 0) PT_THROW(InputError, "--pp-virtual must not be negative (0 = automatic), got ", c.pp_virtual);
  if (c.pp_balance != "params" && c.pp_balance != "time")
    PT_THROW(InputError, "unknown --pp-balance '", c.pp_balance, "' (expected params or time)");
  if (c.dp < 0 || c.tp < 0 || c.pp < 0)
    PT_THROW(InputError, "--dp ", c.dp, " --tp ", c.tp, " --pp ", c.pp, ": sizes must be positive (0 = derived)");
  if (!(c.bucket_mb > 0)) PT_THROW(InputError, "--bucket-mb must be positive, got ", c.bucket_mb);
  if (c.zero < 0 || c.zero > 3)
    PT_THROW(InputError, "--zero must be 0, 1, 2 or 3 (0 = off, 1 = shard the optimizer state, 2 = also the gradients, "
             "3 = also the parameters), got ", c.zero);
  parallel::compress_options(c.compress, c.powersgd_rank, c.powersgd_start_iter, c.seed, c.deterministic);  // InputError if bad
  amp::parse_precision(c.precision);  // InputError if bad
  if (!c.loss_scale.empty()) amp::LossScalerOptions::parse(c.loss_scale);
  if (c.loss_scale_growth_interval < 1)
    PT_THROW(InputError, "--loss-scale-growth-interval must be at least 1, got ", c.loss_scale_growth_interval);
  if (c.save_dtype != "f32" && c.save_dtype != "bf16")
    PT_THROW(InputError, "unknown --save-dtype '", c.save_dtype, "' (expected f32 or bf16)");
  if (c.balance != "none" && c.balance != "auto")
    PT_THROW(InputError, "unknown --balance '", c.balance, "' (expected none or auto)");
  if (c.balance == "auto" && c.deterministic)
    PT_THROW(InputError, "--balance auto cannot be combined with --deterministic (a bit-identical run needs the "
             "fixed even split of every micro-batch)");
  if (c.checkpoint_every < 0) PT_THROW(InputError, "--checkpoint-every must not be negative (0 = only after the last step)");
  if (c.checkpoint_dir.empty() && c.checkpoint_every > 0)
    PT_THROW(InputError, "--checkpoint-every needs --checkpoint-dir DIR");
  if (c.checkpoint_dir.empty() && c.resume) PT_THROW(InputError, "--resume needs --checkpoint-dir DIR");
  if (c.zero == 3 && c.compress == "powersgd")
    PT_THROW(InputError, "--compress powersgd cannot be combined with --zero 3 (PowerSGD compresses all-reduced "
             "matrices; with --zero 3, --compress bf16|fp16 gathers and reduce-scatters in 16 bits)");
  if (c.zero == 3 && c.compress != "none" && c.deterministic)
    PT_THROW(InputError, "--compress ", c.compress,
             " cannot be combined with --deterministic (compressed gradients are not bit-identical to one process)");
  if (c.zero3_prefetch < 0) PT_THROW(InputError, "--zero3-prefetch must not be negative, got ", c.zero3_prefetch);
  if (c.recompute != "none" && c.recompute != "full" && c.recompute != "selective")
    PT_THROW(InputError, "unknown --recompute '", c.recompute, "' (expected none, full or selective)");
}

void validate_builtin_model(const TrainConfig& c) {
  if (!is_gpt_model(c.model) && c.model != "mlp" && c.model != "cnn")
    PT_THROW(InputError, "unknown --model '", c.model, "' (expected gpt-nano, gpt-mini, gpt2-124m, gpt, mlp or cnn)");
  if (c.zero == 3 && !is_gpt_model(c.model))
    PT_THROW(InputError, "--zero 3 shards the GPT models block by block, not --model ", c.model, " (use --zero 1 or 2)");
  if (c.recompute != "none" && !is_gpt_model(c.model))
    PT_THROW(InputError, "--recompute ", c.recompute, " recomputes the GPT models' blocks, not --model ", c.model);
}

int pipeline_virtual_chunks(const TrainConfig& c) {
  if (c.pp_virtual > 0) return c.pp_virtual;
  return c.pp_schedule == "interleaved" ? 2 : 1;
}

}  // namespace paratrain::train
