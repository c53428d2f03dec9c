// Image classifiers for Fashion-MNIST (1x28x28 inputs, 10 classes), with PyTorch names:
//   MLPClassifier: fc1 784->256, ReLU, fc2 256->256, ReLU, fc3 256->10.
//   CNNClassifier: conv1 1->32 3x3 pad 1, ReLU, max-pool 2; conv2 32->64 3x3 pad 1, ReLU,
//                  max-pool 2; flatten 64*7*7; fc1 3136->128, ReLU; fc2 128->10.
// Linear weights use torch.nn.Linear's (out, in) layout; init as PyTorch's defaults.
//
// Lifetimes and ownership: a classifier owns its parameters (Module, nn/module.h), drawn at
// construction from Generator(seed); it keeps no generator (no dropout).
// Thread-safety: not thread-safe (a Module); one thread builds, trains and runs a model.
#pragma once

#include <memory>

#include "paratrain/nn/layers.h"

namespace paratrain::nn {

class Classifier : public Module {
 public:
  // images (N,1,28,28) f32 -> logits (N,10)
  virtual Tensor forward(const Tensor& images) const = 0;
  // Mean cross-entropy; labels (N) integer classes.
  Tensor loss(const Tensor& images, const Tensor& labels) const;
};

class MLPClassifier : public Classifier {
 public:
  explicit MLPClassifier(uint64_t seed);
  Tensor forward(const Tensor& images) const override;
  std::shared_ptr<Linear> fc1, fc2, fc3;
};

class CNNClassifier : public Classifier {
 public:
  explicit CNNClassifier(uint64_t seed);
  Tensor forward(const Tensor& images) const override;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<Linear> fc1, fc2;
};

}  // namespace paratrain::nn
