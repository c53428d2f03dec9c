// What the training loop trains: a Task is one model together with its data and its loss.
//
// The loop (train/trainer.h) asks a Task for micro-batches (fill), for the mean loss of one
// (loss), and for an evaluation; it never looks inside the model. The built-in tasks are the
// GPT language models on token files and the Fashion-MNIST classifiers (make_builtin_task);
// a program using the library can write its own.
//
// Thread-safety: fill() runs on the data prefetcher's worker thread, everything else on the
// training thread; a Task's fill must not touch the model. Lifetime: the loop holds the Task
// for the whole run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/data/prefetcher.h"
#include "paratrain/nn/module.h"
#include "paratrain/tensor/random.h"
#include "paratrain/train/config.h"

namespace paratrain::nn {
class GPT;
}

namespace paratrain::train {

class Task {
 public:
  virtual ~Task() = default;
  virtual nn::Module& module() = 0;
  virtual int64_t steps_per_epoch() const = 0;
  // Fills a training batch (called on the prefetcher's worker thread only).
  virtual void fill(const data::BatchRequest& r, Tensor& inputs, Tensor& targets) = 0;
  // The mean loss over a batch.
  virtual Tensor loss(const Tensor& inputs, const Tensor& targets) = 0;
  virtual int64_t items_per_micro_batch() const = 0;  // tokens (GPT) or samples
  virtual bool counts_tokens() const = 0;
  virtual double flops_per_item() const = 0;
  virtual bool has_eval() const = 0;
  // Fills "val_loss" or "accuracy" in `out` (on rank 0; every rank calls it, `pg` -- the
  // data-parallel group -- may be null). `loss`, when set, replaces loss() for the evaluation
  // batches (a pipeline computes it across its stages and returns it on every stage).
  using LossFn = std::function<Tensor(const Tensor& inputs, const Tensor& targets)>;
  virtual void evaluate(int64_t max_batches, comm::ProcessGroup* pg, nlohmann::json& out, const LossFn& loss) = 0;
  virtual checkpoint::Metadata metadata() const = 0;
  // The generator random layers draw from, or null when the model has none.
  virtual Generator* generator() { return nullptr; }
  // The GPT when the task trains one (tensor and pipeline parallelism cut it), else null.
  virtual nn::GPT* gpt() { return nullptr; }
};

bool is_gpt_model(const std::string& model);

// The task `cfg` names: a GPT on cfg.data (its sizes checked against tensor parallelism of
// `tp` ranks) or a classifier on Fashion-MNIST; micro-batches of `micro_batch` items laid
// out over `dp` data-parallel ranks (DESIGN.md data order). InputError on bad input.
std::unique_ptr<Task> make_builtin_task(const TrainConfig& cfg, int64_t micro_batch, int dp, int tp);

}  // namespace paratrain::train
