// Basic layers: Linear, Embedding, LayerNorm, Dropout, GELU, Conv2d.
//
// Each layer registers its parameters under the names PyTorch / Hugging Face use
// ("weight", "bias"), so state dicts map one to one. Linear supports both weight layouts:
// torch.nn.Linear's (out, in) and Hugging Face Conv1D's (in, out), the latter for GPT.
// forward() is virtual so that a tensor-parallel plan can put a parallel layer (which holds a
// slice of the same parameters under the same names) where a layer was
// (parallel/tensor_parallel/layers.h).
//
// Lifetimes and ownership: a layer owns its parameters (Module); the Generator given to a
// constructor is used only to initialise them, except Dropout's, which is kept by pointer and
// must outlive the layer (a GPT passes its own). Tensors a forward returns hold the autograd
// graph of that forward until released.
// Thread-safety: not thread-safe (a Module): one thread uses a layer at a time.
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
  virtual Tensor forward(const Tensor& x) const;
  // gelu(forward(x)) (tanh form); for a Linear with a bias one op (ops::linear_gelu: one kernel
  // where the device fuses the GELU into the GEMM). A subclass gets gelu(its forward(x)) unless
  // it overrides this as well (a column-parallel layer does, fused).
  virtual Tensor forward_gelu(const Tensor& x) const;
  Tensor weight, bias;
  WeightLayout layout = WeightLayout::InOut;

 protected:
  Linear() = default;  // for a subclass that registers its own (sliced) parameters
};

class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Generator& gen, float std = 1.0f);
  virtual Tensor forward(const Tensor& tokens) const;
  Tensor weight;

  // The GPT's uses of its token table (a vocab-parallel embedding overrides all three):
  // tokens (B,T) -> weight[tokens] + positions.weight[0..T) (B,T,C);
  virtual Tensor forward_with_positions(const Tensor& tokens, const Embedding& positions) const;
  // the tied LM head: hidden (B,T,C) -> logits hidden @ weight^T (B,T,V);
  virtual Tensor tied_logits(const Tensor& hidden) const;
  // and its loss: the mean cross-entropy of tied_logits(hidden) against targets (B,T) i32, in
  // one op (ops::linear_cross_entropy) that keeps the logits to itself.
  virtual Tensor tied_loss(const Tensor& hidden, const Tensor& targets) const;

 protected:
  Embedding() = default;  // for a subclass that registers its own (sliced) weight
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  virtual Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  float eps;
};

class Dropout : public Module {
 public:
  Dropout(float p, Generator& gen) : p_(p), gen_(&gen) {}
  virtual Tensor forward(const Tensor& x) const;
  float p() const { return p_; }
  Generator& generator() const { return *gen_; }

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
