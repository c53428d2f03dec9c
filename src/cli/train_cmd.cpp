#include "train_cmd.h"

#include <iostream>
#include <memory>

#include "cli_util.h"
#include "paratrain/checkpoint/gpt_file.h"
#include "paratrain/data/tokenizer.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/nn/generate.h"
#include "paratrain/train/trainer.h"

namespace paratrain::cli {

void add_train_flags(CLI::App& app, train::TrainConfig& c) {
  app.add_option("--model", c.model, "gpt-nano | gpt-mini | gpt2-124m | gpt | mlp | cnn")
      ->check(CLI::IsMember({"gpt-nano", "gpt-mini", "gpt2-124m", "gpt", "mlp", "cnn"}));
  app.add_option("--n-layer", c.n_layer, "GPT layers (0 = the preset's)");
  app.add_option("--n-head", c.n_head, "GPT attention heads (0 = the preset's)");
  app.add_option("--n-embd", c.n_embd, "GPT width (0 = the preset's)");
  app.add_option("--block-size", c.block_size, "GPT context length (0 = the preset's)");
  app.add_option("--vocab-size", c.vocab_size, "GPT vocabulary (0 = the preset's)");
  app.add_option("--dropout", c.dropout, "dropout probability");
  app.add_option("--data", c.data, "training tokens, llm.c .bin format (GPT models)");
  app.add_option("--val-data", c.val_data, "validation tokens, llm.c .bin format");
  app.add_option("--dataset", c.dataset, "image dataset for mlp/cnn: fashion-mnist");
  app.add_option("--data-dir", c.data_dir, "Fashion-MNIST directory (default: Debian's dataset-fashion-mnist)");
  app.add_option("--micro-batch", c.micro_batch, "sequences/images per micro-batch (0 = 8 for GPT, 64 for images)");
  app.add_option("--grad-accum", c.grad_accum, "micro-batches per optimizer step");
  app.add_option("--steps", c.steps, "optimizer steps (0 = from --epochs)");
  app.add_option("--epochs", c.epochs, "epochs over the training data when --steps is 0 (default 1)");
  app.add_option("--optimizer", c.optimizer, "adamw | sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--lr", c.lr, "peak learning rate (-1 = 6e-4 GPT, 1e-3 images, 0.05 SGD)");
  app.add_option("--beta1", c.beta1, "AdamW beta1");
  app.add_option("--beta2", c.beta2, "AdamW beta2");
  app.add_option("--eps", c.eps, "AdamW epsilon");
  app.add_option("--momentum", c.momentum, "SGD momentum");
  app.add_option("--weight-decay", c.weight_decay, "weight decay (AdamW: 2-D weights only)");
  app.add_option("--lr-schedule", c.lr_schedule, "constant | cosine")->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--warmup-steps", c.warmup_steps, "linear warm-up steps");
  app.add_option("--min-lr", c.min_lr, "final learning rate of the cosine schedule (-1 = lr/10)");
  app.add_option("--grad-clip", c.grad_clip, "clip the global gradient norm to this (0 = off)");
  app.add_option("--seed", c.seed, "seed of every random choice (init, data order, dropout)");
  app.add_option("--threads", c.threads, "compute threads (0 = the host's cores split among local ranks)");
  app.add_option("--device", c.device, "cpu, cuda (each rank on the GPU of its local rank) or cuda:N (docs/cuda.md)");
  app.add_flag("--deterministic", c.deterministic, "bit-reproducible reductions");
  app.add_option("--precision", c.precision,
                 "fp32 | bf16 | fp16: matrix products, attention and convolutions in the half type, f32 master "
                 "weights (docs/amp.md)");
  app.add_option("--loss-scale", c.loss_scale,
                 "none | dynamic | N: loss scaling (default: dynamic with fp16, none otherwise)");
  app.add_option("--loss-scale-growth-interval", c.loss_scale_growth_interval,
                 "dynamic loss scaling: clean steps in a row before the scale doubles");
  app.add_option("--save-dtype", c.save_dtype, "f32 | bf16: dtype of the --save-final model file");
  app.add_option("--backend", c.backend, "communication backend with several ranks: auto | shm | tcp | mpi | nccl")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "mpi", "nccl"}));
  app.add_option("--dp", c.dp, "data-parallel ranks (0 = derived: world size / (tp x pp)); dp x tp x pp = world size");
  app.add_option("--tp", c.tp, "tensor-parallel ranks (Megatron-style, GPT models; 0 = derived, else 1; docs/tensor_parallel.md)");
  app.add_option("--pp", c.pp, "pipeline stages (GPT models; 0 = derived, else 1; docs/pipeline.md)");
  app.add_option("--pp-schedule", c.pp_schedule, "pipeline schedule: gpipe | 1f1b | interleaved | zb1p (zero bubble)");
  app.add_option("--pp-virtual", c.pp_virtual, "model chunks per pipeline rank (interleaved; 0 = 2 there, 1 otherwise)");
  app.add_option("--pp-balance", c.pp_balance, "cut the blocks into stages by parameter count (params) or measured time (time)");
  app.add_flag("--sequence-parallel", c.sequence_parallel,
               "with --tp: LayerNorm and dropout on 1/tp of the sequence (all-gather/reduce-scatter instead of all-reduce)");
  app.add_option("--bucket-mb", c.bucket_mb, "DDP gradient bucket size in MiB");
  app.add_option("--zero", c.zero,
                 "ZeRO stage: 0 = off, 1 = shard the optimizer state over the data-parallel ranks, 2 = also the "
                 "gradients, 3 = also the parameters (fully sharded, GPT models; docs/ddp.md)");
  app.add_flag("--zero3-reshard-after-forward,!--no-zero3-reshard-after-forward", c.zero3_reshard_after_forward,
               "--zero 3: free a block's gathered parameters after its forward (default; off keeps them until its "
               "backward: one gather less per block, more memory)");
  app.add_option("--recompute", c.recompute,
                 "none | full | selective: recompute activations in backward instead of keeping them (same gradients, "
                 "less memory): full recomputes each GPT block (about one more forward), selective only the "
                 "attention internals")
      ->check(CLI::IsMember({"none", "full", "selective"}));
  app.add_option("--zero3-prefetch", c.zero3_prefetch,
                 "--zero 3: blocks whose all-gather is issued ahead of the one computing (default 1, 0 = none)");
  app.add_option("--compress", c.compress, "gradient compression on the wire: none | fp16 | bf16 | powersgd (docs/ddp.md)")
      ->check(CLI::IsMember({"none", "fp16", "bf16", "powersgd"}));
  app.add_option("--powersgd-rank", c.powersgd_rank, "PowerSGD: rank r; an n x m gradient is sent as r(n+m) values");
  app.add_option("--powersgd-start-iter", c.powersgd_start_iter, "PowerSGD: uncompressed f32 all-reduce for the first N steps");
  app.add_option("--balance", c.balance,
                 "none | auto: give faster ranks larger micro-batches (the loss is weighted so the gradient "
                 "stays the global-batch mean)");
  app.add_option("--init-from", c.init_from, "initial weights, safetensors (HF GPT-2 names for GPT)");
  app.add_option("--save-final", c.save_final, "write the final weights here, safetensors");
  app.add_option("--eval-every", c.eval_every, "evaluate every N steps (0 = only after the last step)");
  app.add_option("--eval-batches", c.eval_batches, "validation batches per evaluation (GPT; a batch is micro-batch x ranks windows, shared by the ranks)");
  app.add_option("--metrics", c.metrics, "write one JSON line per step to this file");
  app.add_option("--trace", c.trace_dir,
                 "write a timeline to this directory: rank<R>.trace.json per rank and trace.json merged "
                 "(Chrome trace-event JSON; open in Perfetto)");
  app.add_flag("--quiet", c.quiet, "no progress line");
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "save the training state under this directory (docs/checkpoints.md)");
  app.add_option("--checkpoint-every", c.checkpoint_every, "save every N optimizer steps (0 = only after the last step)");
  app.add_flag("--resume", c.resume, "continue from the latest checkpoint in --checkpoint-dir (fresh start if none)");
}

int run_train(int argc, char** argv) {
  train::TrainConfig c;
  CLI::App app{"Train a model: one process, or one per rank under paratrain launch, mpirun or srun (docs/ddp.md)", "train"};
  app.option_defaults()->always_capture_default();
  add_train_flags(app, c);
  if (!parse_or_throw(app, argc, argv)) return 0;
  train::train(c, std::cerr);
  return 0;
}

int run_sample(int argc, char** argv) {
  std::string model_path, tokenizer_path, prompt;
  int64_t max_tokens = 100, top_k = 40, n_head = 0;
  double temperature = 0.8;
  uint64_t seed = 1337;
  int threads = 0;
  CLI::App app{"Generate text with a trained GPT", "sample"};
  app.option_defaults()->always_capture_default();
  app.add_option("--model", model_path, "model weights, safetensors (from --save-final)")->required();
  app.add_option("--tokenizer", tokenizer_path, "sentencepiece model (from data prepare)")->required();
  app.add_option("--prompt", prompt, "text to continue");
  app.add_option("--max-tokens", max_tokens, "tokens to generate");
  app.add_option("--temperature", temperature, "sampling temperature (0 = greedy)");
  app.add_option("--top-k", top_k, "sample among the k most likely tokens (0 = all)");
  app.add_option("--n-head", n_head, "attention heads when the file does not record them");
  app.add_option("--seed", seed, "sampling seed");
  app.add_option("--threads", threads, "compute threads (0 = all cores)");
  if (!parse_or_throw(app, argc, argv)) return 0;
  if (max_tokens < 0) PT_THROW(InputError, "--max-tokens must not be negative");
  if (temperature < 0) PT_THROW(InputError, "--temperature must not be negative");
  if (top_k < 0) PT_THROW(InputError, "--top-k must not be negative");
  if (n_head < 0) PT_THROW(InputError, "--n-head must not be negative");
  if (threads > 0) kernels::cpu::set_num_threads(threads);

  data::Tokenizer tok(tokenizer_path);
  checkpoint::GPTFileOptions fo;
  fo.n_head = n_head;
  std::unique_ptr<nn::GPT> model = checkpoint::load_gpt(model_path, fo);
  if (tok.vocab_size() > model->config().vocab_size)
    PT_THROW(InputError, "tokenizer has ", tok.vocab_size(), " tokens but the model only ", model->config().vocab_size);

  std::vector<int32_t> ids = {static_cast<int32_t>(tok.bos_id())};
  for (int32_t id : tok.encode(prompt)) ids.push_back(id);
  nn::GenerateOptions go;
  go.temperature = temperature;
  go.top_k = top_k;
  go.max_new_tokens = max_tokens;
  go.stop_token = tok.eos_id();
  go.vocab_limit = tok.vocab_size();
  go.seed = seed;
  ids = nn::generate(*model, ids, go);
  std::vector<int32_t> out(ids.begin() + 1, ids.end());
  std::cout << tok.decode(out) << "\n";
  return 0;
}

}  // namespace paratrain::cli
