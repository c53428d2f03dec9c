#include "paratrain/nn/classifiers.h"

#include "paratrain/autograd/ops.h"

namespace paratrain::nn {

Tensor Classifier::loss(const Tensor& images, const Tensor& labels) const {
  return ops::cross_entropy(forward(images), labels);
}

MLPClassifier::MLPClassifier(uint64_t seed) {
  Generator gen(seed);
  fc1 = register_module("fc1", std::make_shared<Linear>(784, 256, true, WeightLayout::OutIn, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(256, 256, true, WeightLayout::OutIn, gen));
  fc3 = register_module("fc3", std::make_shared<Linear>(256, 10, true, WeightLayout::OutIn, gen));
}

Tensor MLPClassifier::forward(const Tensor& images) const {
  Tensor x = ops::reshape(images, {images.size(0), -1});
  x = ops::relu(fc1->forward(x));
  x = ops::relu(fc2->forward(x));
  return fc3->forward(x);
}

CNNClassifier::CNNClassifier(uint64_t seed) {
  Generator gen(seed);
  conv1 = register_module("conv1", std::make_shared<Conv2d>(1, 32, 3, 1, 1, gen));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(32, 64, 3, 1, 1, gen));
  fc1 = register_module("fc1", std::make_shared<Linear>(64 * 7 * 7, 128, true, WeightLayout::OutIn, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(128, 10, true, WeightLayout::OutIn, gen));
}

Tensor CNNClassifier::forward(const Tensor& images) const {
  if (images.dim() != 4 || images.size(1) != 1 || images.size(2) != 28 || images.size(3) != 28)
    PT_THROW(InputError, "CNN input must be (N,1,28,28), got ", shape_str(images.shape()));
  Tensor x = ops::max_pool2d(ops::relu(conv1->forward(images)), 2, 2);
  x = ops::max_pool2d(ops::relu(conv2->forward(x)), 2, 2);
  x = ops::reshape(x, {x.size(0), -1});
  return fc2->forward(ops::relu(fc1->forward(x)));
}

}  // namespace paratrain::nn
