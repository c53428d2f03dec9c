// What the training loop trains: a Task is one model together with its data and its loss.
//
// The loop (train/trainer.h) asks a Task for micro-batches (fill), for the mean loss of one
// (loss), and for an evaluation; it never looks inside the model. The built-in tasks are the
// GPT language models on token files and the Fashion-MNIST classifiers (make_builtin_task);
// a program brings its own model either through SupervisedTask (train/supervised_task.h: a
// Module, a loss function and a Dataset, nothing else to write) or by implementing Task.
//
// Implementing Task: module(), fill() and loss() are required; every other virtual has a
// default that suits a model without tokens, evaluation or randomness. fill() must follow
// the data-order contract (data/data_order.h): the items of request (step, micro_step,
// first, count) are DataOrder::items_range(step, micro_step, first, count) of a DataOrder
// built in setup() from the TaskLayout the loop passes -- then N data-parallel ranks train
// exactly as one rank accumulating N micro-batches, and a resumed run sees the data the
// uninterrupted one would have.
//
// Call order, per train() call: setup() once, then (everything on the training thread except
// fill) steps_per_epoch/num_examples, module, loss, evaluate, metadata, generator.
//
// Thread-safety: fill() runs on the data prefetcher's worker thread, concurrently with
// loss() and evaluate() on the training thread; it must not touch the model or anything the
// training thread changes. Lifetime: the caller owns the Task; train() holds a reference for
// the duration of the call only (a Task can be trained again, e.g. resumed, by a later call).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/data/data_order.h"
#include "paratrain/data/prefetcher.h"
#include "paratrain/nn/module.h"
#include "paratrain/tensor/random.h"
#include "paratrain/train/config.h"

namespace paratrain::nn {
class GPT;
}

namespace paratrain::train {

// How the run lays out its global batch (DESIGN.md data order), given to Task::setup.
struct TaskLayout {
  int64_t micro_batch = 1;  // examples per micro-batch per data-parallel rank
  int64_t grad_accum = 1;   // micro-batches per optimizer step
  int dp = 1;               // data-parallel ranks
  int dp_rank = 0;          // this rank's index among them
  uint64_t seed = 0;        // TrainConfig::seed: the data order's permutation seed
  data::BatchLayout batch_layout() const { return {micro_batch, grad_accum, dp}; }
};

class Task {
 public:
  virtual ~Task() = default;

  // ---- required ----
  // The model whose parameters are trained (DDP/ZeRO wrap it; checkpoints hold its state).
  virtual nn::Module& module() = 0;
  // Fills the training batch of `r` (called on the prefetcher's worker thread only):
  // `inputs` and `targets` get r.count examples stacked on dim 0 (reallocate them when their
  // shape or dtype differs).
  virtual void fill(const data::BatchRequest& r, Tensor& inputs, Tensor& targets) = 0;
  // The mean loss over a batch: a scalar that depends on the parameters. The loop runs it
  // under autocast (TrainConfig::precision) and calls backward on it.
  virtual Tensor loss(const Tensor& inputs, const Tensor& targets) = 0;

  // ---- optional ----
  // A short name for logs and the checkpoint's run record ("gpt-nano", "mlp", ...).
  virtual std::string name() const { return "custom"; }
  // Called at the start of every train() call, before anything else; may throw InputError
  // (e.g. a dataset shorter than one global batch).
  virtual void setup(const TaskLayout& layout) {}
  // Optimizer steps per pass over the training data (TrainConfig::epochs needs it); 0 = the
  // task does not know, and TrainConfig::steps must be set.
  virtual int64_t steps_per_epoch() const { return 0; }
  // Examples in the training data (0 = unknown): compared across ranks for a user's task.
  virtual int64_t num_examples() const { return 0; }
  // Items that throughput and MFU count per example: tokens per sequence (GPT), else 1.
  virtual int64_t items_per_example() const { return 1; }
  virtual bool counts_tokens() const { return false; }  // metrics say tokens_per_s, else samples_per_s
  virtual const char* example_noun() const { return "examples"; }  // the run header's word for them
  // Training FLOPs (forward + backward) per item; 0 = 6 x the model's parameters.
  virtual double flops_per_item() const { return 0; }
  virtual bool has_eval() const { return false; }
  // Fills "val_loss" and/or "accuracy" in `out` (on rank 0 at least; every rank calls it,
  // `pg` -- the data-parallel group -- may be null). `loss`, when set, replaces loss() for the
  // evaluation batches (a pipeline computes it across its stages and returns it on every
  // stage). Runs on the training thread, under autocast.
  using LossFn = std::function<Tensor(const Tensor& inputs, const Tensor& targets)>;
  virtual void evaluate(int64_t max_batches, comm::ProcessGroup* pg, nlohmann::json& out, const LossFn& loss) {}
  // String metadata of the checkpoints and of TrainConfig::save_final's file.
  virtual checkpoint::Metadata metadata() const { return {{"format", "paratrain-task"}, {"task", name()}}; }
  // The generator random layers (dropout) draw from, or null when the model has none; its
  // state is saved in checkpoints and restored on resume.
  virtual Generator* generator() { return nullptr; }
  // The GPT when the task trains one (tensor and pipeline parallelism, ZeRO 3 and recompute
  // cut it), else null.
  virtual nn::GPT* gpt() { return nullptr; }
};

bool is_gpt_model(const std::string& model);

// The task `cfg` names: a GPT on cfg.data (its sizes checked against tensor parallelism of
// `tp` ranks) or a classifier on Fashion-MNIST; micro-batches of `micro_batch` items laid
// out over `dp` data-parallel ranks (DESIGN.md data order). InputError on bad input.
std::unique_ptr<Task> make_builtin_task(const TrainConfig& cfg, int64_t micro_batch, int dp, int tp);

}  // namespace paratrain::train
