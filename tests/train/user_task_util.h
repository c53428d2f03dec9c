// A program's own model, data and loss, written the way a library user writes them, shared by
// user_task_test.cpp (one process) and user_task_helper.cpp (one rank of a multi-rank run):
// a two-layer tanh MLP classifying three noisy Gaussian blobs in the plane, with
// cross-entropy, a TensorDataset, and an accuracy count.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "paratrain/autograd/ops.h"
#include "paratrain/nn/layers.h"
#include "paratrain/train/config.h"
#include "paratrain/train/supervised_task.h"

namespace paratrain::test {

class TinyMlp : public nn::Module {
 public:
  TinyMlp(int64_t hidden, uint64_t seed) : gen_(seed) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(2, hidden, true, nn::WeightLayout::OutIn, gen_));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, 3, true, nn::WeightLayout::OutIn, gen_));
  }
  Tensor forward(const Tensor& x) const { return fc2->forward(ops::tanh(fc1->forward(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;

 private:
  Generator gen_;
};

struct Blobs {
  Tensor x, y;  // x [n, 2] f32, y [n] i32 in {0, 1, 2}
};

inline Blobs make_blobs(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<float> xs;
  std::vector<int32_t> ys;
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i % 3);
    const double a = 2.0944 * c;
    xs.push_back(static_cast<float>(1.5 * std::cos(a) + 0.6 * g.normal()));
    xs.push_back(static_cast<float>(1.5 * std::sin(a) + 0.6 * g.normal()));
    ys.push_back(c);
  }
  return {Tensor::from_vector(xs, {n, 2}), Tensor::from_vector_i32(ys, {n})};
}

// Correct predictions of a batch: argmax of the logits against the labels.
inline int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const std::vector<float> l = logits.to(DType::F32).to_vector();
  const int32_t* y = labels.data<int32_t>();
  int64_t ok = 0;
  for (int64_t i = 0; i < labels.numel(); ++i)
    ok += std::max_element(l.begin() + 3 * i, l.begin() + 3 * i + 3) - (l.begin() + 3 * i) == y[i];
  return ok;
}

// The model, its data and the task over them (the task refers to the others: kept together).
struct BlobsRun {
  TinyMlp model;
  Blobs train_data, val_data;
  train::TensorDataset train_set, val_set;
  train::SupervisedTask task;
  explicit BlobsRun(int64_t hidden = 16, int64_t n_train = 256, uint64_t model_seed = 3)
      : model(hidden, model_seed),
        train_data(make_blobs(n_train, 11)),
        val_data(make_blobs(96, 12)),
        train_set(train_data.x, train_data.y),
        val_set(val_data.x, val_data.y),
        task(model, [this](const Tensor& x, const Tensor& y) { return ops::cross_entropy(model.forward(x), y); },
             train_set, options()) {}

 private:
  train::SupervisedOptions options() {
    train::SupervisedOptions o;
    o.name = "blobs-mlp";
    o.validation = &val_set;
    o.eval_batch = 32;
    o.correct = [this](const Tensor& x, const Tensor& y) { return count_correct(model.forward(x), y); };
    return o;
  }
};

inline train::TrainConfig blobs_config(int64_t steps) {
  train::TrainConfig c;
  c.steps = steps;
  c.micro_batch = 8;
  c.lr = 0.02;
  c.threads = 1;
  c.quiet = true;
  c.seed = 7;
  return c;
}

}  // namespace paratrain::test
