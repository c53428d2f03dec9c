#include "paratrain/nn/layers.h"

#include <cmath>
#include <typeinfo>

#include "paratrain/autograd/ops.h"

namespace paratrain::nn {

Linear::Linear(int64_t in, int64_t out, bool has_bias, WeightLayout l, Generator& gen) : layout(l) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  Tensor w = Tensor::empty(l == WeightLayout::OutIn ? Shape{out, in} : Shape{in, out});
  fill_uniform(w, gen, -bound, bound);
  weight = register_parameter("weight", w);
  if (has_bias) {
    Tensor b = Tensor::empty({out});
    fill_uniform(b, gen, -bound, bound);
    bias = register_parameter("bias", b);
  }
}

Tensor Linear::forward(const Tensor& x) const {
  return ops::linear(x, weight, bias, layout == WeightLayout::InOut);
}

Tensor Linear::forward_gelu(const Tensor& x) const {
  // A subclass's forward may do more than the GEMM (a row-parallel layer reduces): unless it
  // overrides this too, it gets its own forward, then the GELU.
  if (typeid(*this) != typeid(Linear) || !bias.defined()) return ops::gelu(forward(x));
  return ops::linear_gelu(x, weight, bias, layout == WeightLayout::InOut);
}

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen, float std) {
  Tensor w = Tensor::empty({num, dim});
  fill_normal(w, gen, 0.0f, std);
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& tokens) const { return ops::embedding(tokens, weight); }

Tensor Embedding::forward_with_positions(const Tensor& tokens, const Embedding& positions) const {
  return ops::gpt_embedding(tokens, weight, positions.weight);
}

Tensor Embedding::tied_logits(const Tensor& hidden) const { return ops::matmul(hidden, weight, /*trans_b=*/true); }

Tensor Embedding::tied_loss(const Tensor& hidden, const Tensor& targets) const {
  return ops::linear_cross_entropy(hidden, weight, targets);
}

LayerNorm::LayerNorm(int64_t dim, float e) : eps(e) {
  weight = register_parameter("weight", Tensor::full({dim}, 1.0));
  bias = register_parameter("bias", Tensor::zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) const { return ops::layer_norm(x, weight, bias, eps); }

Tensor Dropout::forward(const Tensor& x) const { return ops::dropout(x, p_, is_training(), *gen_); }

Tensor GELU::forward(const Tensor& x) const { return ops::gelu(x); }

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t s, int64_t p, Generator& gen) : stride(s), padding(p) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in * kernel * kernel));
  Tensor w = Tensor::empty({out, in, kernel, kernel});
  fill_uniform(w, gen, -bound, bound);
  weight = register_parameter("weight", w);
  Tensor b = Tensor::empty({out});
  fill_uniform(b, gen, -bound, bound);
  bias = register_parameter("bias", b);
}

Tensor Conv2d::forward(const Tensor& x) const { return ops::conv2d(x, weight, bias, stride, padding); }

}  // namespace paratrain::nn
