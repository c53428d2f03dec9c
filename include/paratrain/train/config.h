// Everything `paratrain train` can be told, as one struct (the CLI fills it; a program using
// the library fills it directly and calls train(), train/trainer.h, which also says which
// fields apply to a program's own Task). Plain value; no thread-safety concerns.
#pragma once

#include <cstdint>
#include <string>

namespace paratrain::train {

struct TrainConfig {
  // ---- model ----
  std::string model = "gpt-nano";  // gpt-nano | gpt-mini | gpt2-124m | gpt | mlp | cnn
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;  // 0 = preset's
  float dropout = 0.0f;
  // ---- data ----
  std::string data;      // token .bin (GPT models)
  std::string val_data;  // token .bin for evaluation
  std::string dataset;   // "fashion-mnist" (mlp, cnn)
  std::string data_dir;  // Fashion-MNIST directory; "" = Debian's location
  int64_t micro_batch = 0;  // 0 = model's default (8 for GPT, 64 for images)
  int64_t grad_accum = 1;
  int64_t steps = 0;   // optimizer steps; 0 = from --epochs
  double epochs = 0;   // used when steps == 0 (1 when both are 0)
  // End this call after step N (0 = at the last step): a run in sessions. The learning-rate
  // schedule and the data order still span `steps`; a later call with resume continues.
  int64_t stop_at_step = 0;
  // ---- optimizer and schedule ----
  std::string optimizer = "adamw";  // adamw | sgd
  double lr = -1;                   // < 0: 6e-4 for GPT, 1e-3 for images (AdamW), 0.05 (SGD)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, momentum = 0.9, weight_decay = 0.1;
  std::string lr_schedule = "cosine";  // constant | cosine
  int64_t warmup_steps = 0;
  double min_lr = -1;  // < 0: lr / 10
  double grad_clip = 1.0;  // 0 = off
  // ---- run ----
  uint64_t seed = 1337;
  int threads = 0;  // 0 = the host's cores split among the ranks on it
  // cpu | cuda (each rank on the GPU of its local rank) | cuda:N (every rank of the node on
  // GPU N). On a GPU the model moves there before the run starts, batches go up through
  // pinned memory and every layout runs; backend auto is nccl there, and shm, tcp and mpi
  // stage the GPU buffers through host memory, so several ranks may share one GPU
  // (docs/cuda.md).
  std::string device = "cpu";
  bool deterministic = false;
  // ---- mixed precision (docs/amp.md) ----
  std::string precision = "fp32";  // fp32 | bf16 | fp16: compute dtype of the forward (autocast)
  std::string loss_scale;          // none | dynamic | N; "" = dynamic for fp16, none otherwise
  int64_t loss_scale_growth_interval = 2000;  // dynamic scaling: clean steps before the scale doubles
  std::string save_dtype = "f32";  // f32 | bf16: dtype of --save-final's model file
  // ---- data parallel (WORLD_SIZE > 1, mpirun or Slurm: one process per rank) ----
  std::string backend = "auto";  // auto | shm | tcp | mpi | nccl
  // Device mesh (parallel/mesh.h): dp x tp x pp = world size; 0 = derived (the one left out).
  int64_t dp = 0;                // data-parallel ranks
  int64_t tp = 0;                // tensor-parallel ranks (GPT models; docs/tensor_parallel.md)
  int64_t pp = 0;                // pipeline stages (GPT models; docs/pipeline.md)
  std::string pp_schedule = "1f1b";  // gpipe | 1f1b | interleaved | zb1p
  int pp_virtual = 0;                // model chunks per pipeline rank (interleaved; 0 = 2 there, 1 elsewhere)
  std::string pp_balance = "params";  // params | time: how the blocks are cut into stages
  bool sequence_parallel = false;  // with tp > 1: LayerNorm/dropout on 1/tp of the sequence
  double bucket_mb = 25;         // DDP gradient bucket size, MiB
  int zero = 0;                  // ZeRO stage: 0 off, 1 shard optimizer state, 2 also gradients, 3 also parameters
  bool zero3_reshard_after_forward = true;  // --zero 3: free a block's parameters after its forward
  int zero3_prefetch = 1;        // --zero 3: blocks gathered ahead
  std::string recompute = "none";  // none | full | selective: recompute activations in backward (full: whole blocks; selective: attention internals)
  std::string compress = "none";     // none | fp16 | bf16 | powersgd: DDP gradient compression
  int64_t powersgd_rank = 4;         // PowerSGD: rank of the factors
  int64_t powersgd_start_iter = 10;  // PowerSGD: plain f32 all-reduce for the first steps
  std::string balance = "none";  // none | auto: micro-batch sizes follow the ranks' measured speed
  std::string init_from, save_final;
  int64_t eval_every = 0;  // 0 = only after the last step
  int64_t eval_batches = 20;
  std::string metrics;
  std::string trace_dir;  // "" = off; else DIR/rank<R>.trace.json and DIR/trace.json (monitor/trace_file.h)
  bool quiet = false;  // no progress line
  // ---- training-state checkpoints (docs/checkpoints.md) ----
  std::string checkpoint_dir;    // "" = no checkpoints
  int64_t checkpoint_every = 0;  // save every N optimizer steps (0 = only after the last step)
  bool resume = false;           // continue from the latest checkpoint in checkpoint_dir
};

}  // namespace paratrain::train
