// SupervisedTask: the ready-made Task (train/task.h) for a user's own model -- a Module, a
// loss function and a Dataset -- so that train(cfg, task, log) (train/trainer.h) gives it
// everything `paratrain train` has: DDP, accumulation, ZeRO 1/2, compression, mixed
// precision, checkpoints and resume, metrics, evaluation.
//
//   MyNet net(seed);                                  // any nn::Module
//   train::TensorDataset data(inputs, targets);       // or your own train::Dataset
//   train::SupervisedTask task(net, [&](const Tensor& x, const Tensor& y) {
//     return my_loss(net.forward(x), y);              // the batch's mean loss, a scalar
//   }, data);
//   train::train(cfg, task, std::cerr);
//
// Data order (data/data_order.h): the training examples of each (step, micro-step, rank) are
// those DataOrder picks for TrainConfig::seed and the run's layout, so N ranks train exactly
// as one rank accumulating N micro-batches, and a resumed run continues the same data.
//
// Evaluation (when `options.validation` is set): the validation set is cut into batches of
// `options.eval_batch` examples in index order (at most TrainConfig::eval_batches of them,
// 0 = all); batch b is computed by data-parallel rank b mod dp, and the sums are combined in
// batch order, so the figures do not depend on the layout. "val_loss" is the mean of the
// loss function over the examples (each batch weighted by its size); with `options.correct`
// also "accuracy" = correctly predicted / examples. The model is in eval mode and no
// gradients are recorded meanwhile.
//
// Errors (InputError, thrown by train() before the first step unless noted): an empty
// dataset or one shorter than one global batch (naming both sizes); a validation example
// whose shapes differ from the training examples; during training, an example whose shapes
// or dtypes differ from example 0's (naming the index); a loss that is not a scalar or does
// not depend on the parameters.
//
// Thread-safety: as Task -- fill() (the datasets' get()) on the prefetcher's worker thread,
// the loss function and `correct` on the training thread only. Lifetime: the task refers to
// the model, the loss function's captures, the datasets and the generator; the caller keeps
// them alive while the task is used. The task owns none of them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "paratrain/data/data_order.h"
#include "paratrain/train/dataset.h"
#include "paratrain/train/task.h"

namespace paratrain::train {

struct SupervisedOptions {
  std::string name = "custom";          // Task::name(): the run header and checkpoint record
  const Dataset* validation = nullptr;  // evaluation data (same example shapes), or none
  // The number of correctly predicted examples of an evaluation batch (inputs [B, ...],
  // targets [B, ...]); when set, evaluation also reports "accuracy".
  std::function<int64_t(const Tensor& inputs, const Tensor& targets)> correct;
  int64_t eval_batch = 64;         // examples per evaluation batch (fixed: layout-independent)
  double flops_per_example = 0;    // training FLOPs per example for MFU; 0 = 6 x parameters
  Generator* generator = nullptr;  // what the model's random layers draw from (checkpointed)
  checkpoint::Metadata metadata;   // extra entries for checkpoints and save_final files
};

class SupervisedTask final : public Task {
 public:
  // `loss(inputs, targets)`: the model's forward on a batch and its mean loss (a scalar).
  SupervisedTask(nn::Module& model, LossFn loss, const Dataset& train, SupervisedOptions options = {});

  nn::Module& module() override { return model_; }
  void fill(const data::BatchRequest& r, Tensor& inputs, Tensor& targets) override;
  Tensor loss(const Tensor& inputs, const Tensor& targets) override;

  std::string name() const override { return options_.name; }
  void setup(const TaskLayout& layout) override;
  int64_t steps_per_epoch() const override { return steps_per_epoch_; }
  int64_t num_examples() const override { return train_.size(); }
  double flops_per_item() const override { return options_.flops_per_example; }
  bool has_eval() const override { return options_.validation != nullptr; }
  void evaluate(int64_t max_batches, comm::ProcessGroup* pg, nlohmann::json& out, const LossFn& loss) override;
  checkpoint::Metadata metadata() const override;
  Generator* generator() override { return options_.generator; }

 private:
  struct Spec {
    Shape input, target;
    DType input_dtype = DType::F32, target_dtype = DType::F32;
  };
  // Stacks `dataset`'s examples `indices` into inputs/targets, each checked against spec_.
  void gather(const Dataset& dataset, const char* which, const std::vector<int64_t>& indices, Tensor& inputs,
              Tensor& targets) const;

  nn::Module& model_;
  LossFn loss_;
  const Dataset& train_;
  SupervisedOptions options_;
  Spec spec_;
  std::optional<data::DataOrder> order_;  // built by setup(); used by fill() only
  int64_t steps_per_epoch_ = 0;           // set by setup()
};

}  // namespace paratrain::train
