// Basic layers: Linear, Embedding, LayerNorm, Dropout, GELU, Conv2d.
//
// Each layer registers its parameters under the names PyTorch / Hugging Face use
// ("weight", "bias"), so state dicts map one to one. Linear supports both weight layouts:
// torch.nn.Linear's (out, in) and Hugging Face Conv1D's (in, out), the latter for GPT.
#pragma once

#include <memory>

#include "paratrain/nn/module.h"
#include "paratrain/tensor/random.h"

namespace paratrain::nn {

enum class WeightLayout { OutIn, InOut };

class Linear : public Module {
 public:
  // Initialised as torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
  Linear(int64_t in, int64_t out, bool bias, WeightLayout layout, Generator& gen);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  WeightLayout layout;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Generator& gen, float std = 1.0f);
  Tensor forward(const Tensor& tokens) const;
  Tensor weight;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  float eps;
};

class Dropout : public Module {
 public:
  Dropout(float p, Generator& gen) : p_(p), gen_(&gen) {}
  Tensor forward(const Tensor& x) const;

 private:
  float p_;
  Generator* gen_;  // owned by the model; must outlive this layer
};

// GELU, tanh form (no parameters).
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) const;
};

class Conv2d : public Module {
 public:
  // Initialised as torch.nn.Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in*k*k.
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, Generator& gen);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  int64_t stride, padding;
};

}  // namespace paratrain::nn
