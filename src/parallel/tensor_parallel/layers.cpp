#include "paratrain/parallel/tensor_parallel/layers.h"

#include <cstring>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/base/error.h"
#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"

namespace paratrain::parallel {

namespace {

// Rows of `table` (R, C) for `ids` (local row or -1 = not on this rank: zeros) -> (ids..., C).
// Backward adds each row's gradient into its table row, in position order.
Tensor masked_lookup(const Tensor& ids, const Tensor& table) {
  const int64_t C = table.size(1), n = ids.numel();
  Shape out_shape = ids.shape();
  out_shape.push_back(C);
  Tensor w = table.contiguous();
  Tensor out = Tensor::zeros(out_shape, w.dtype());
  const size_t row = static_cast<size_t>(C) * dtype_size(w.dtype());
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    if (id[i] >= 0)
      std::memcpy(static_cast<char*>(out.data_ptr()) + i * row, static_cast<const char*>(w.data_ptr()) + id[i] * row, row);
  if (autograd::any_requires_grad({&table})) {
    const Shape tshape = table.shape();
    autograd::record(std::make_shared<autograd::LambdaNode>("vocab_parallel_embedding",
                                                            [ids, tshape, n, C](std::vector<Tensor>& g) {
                                                              Tensor dw = Tensor::zeros(tshape);
                                                              if (!g[0].defined()) return std::vector<Tensor>{dw};
                                                              Tensor go = g[0].to(DType::F32).contiguous();
                                                              const float* s = go.data<float>();
                                                              float* d = dw.data<float>();
                                                              const int32_t* id = ids.data<int32_t>();
                                                              for (int64_t i = 0; i < n; ++i)
                                                                if (id[i] >= 0)
                                                                  for (int64_t c = 0; c < C; ++c)
                                                                    d[id[i] * C + c] += s[i * C + c];
                                                              return std::vector<Tensor>{dw};
                                                            }),
                     {&table}, {&out});
  }
  return out;
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& whole, int blocks, std::shared_ptr<TpGroup> tp,
                                           bool sequence_parallel)
    : blocks_(blocks), tp_(std::move(tp)), sp_(sequence_parallel) {
  if (whole.layout != nn::WeightLayout::InOut)
    PT_THROW(InputError, "ColumnParallelLinear: the whole layer must use the (in, out) weight layout");
  layout = nn::WeightLayout::InOut;
  weight = register_parameter("weight", checkpoint::cut_tensor(whole.weight.detach(), weight_cut(), tp_->rank(), tp_->size()));
  if (whole.bias.defined())
    bias = register_parameter("bias", checkpoint::cut_tensor(whole.bias.detach(), bias_cut(), tp_->rank(), tp_->size()));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  const Tensor in = sp_ ? gather_sequence(x, tp_) : copy_to_tp(x, tp_);
  return ops::linear(in, weight, bias, /*in_out_layout=*/true);
}

RowParallelLinear::RowParallelLinear(const nn::Linear& whole, std::shared_ptr<TpGroup> tp, bool sequence_parallel)
    : tp_(std::move(tp)), sp_(sequence_parallel) {
  if (whole.layout != nn::WeightLayout::InOut)
    PT_THROW(InputError, "RowParallelLinear: the whole layer must use the (in, out) weight layout");
  layout = nn::WeightLayout::InOut;
  weight = register_parameter("weight", checkpoint::cut_tensor(whole.weight.detach(), weight_cut(), tp_->rank(), tp_->size()));
  if (whole.bias.defined()) bias = register_parameter("bias", whole.bias.detach().clone());
}

Tensor RowParallelLinear::forward(const Tensor& x) const {
  Tensor y = ops::linear(x, weight, Tensor(), /*in_out_layout=*/true);
  y = sp_ ? reduce_scatter_sequence(y, tp_) : reduce_from_tp(y, tp_);
  if (!bias.defined()) return y;
  // Added once, after the reduction; with the sequence split each rank's part of the bias
  // gradient is summed by f.
  return ops::add_bias(y, sp_ ? copy_to_tp(bias, tp_) : bias);
}

VocabParallelEmbedding::VocabParallelEmbedding(const nn::Embedding& whole, std::shared_ptr<TpGroup> tp,
                                               bool sequence_parallel)
    : vocab_(whole.weight.size(0)), tp_(std::move(tp)), sp_(sequence_parallel) {
  weight = register_parameter("weight", checkpoint::cut_tensor(whole.weight.detach(), weight_cut(), tp_->rank(), tp_->size()));
  rows_ = weight.size(0);
  start_ = rows_ * tp_->rank();
}

Tensor VocabParallelEmbedding::forward(const Tensor& tokens_in) const {
  const Tensor tokens = tokens_in.contiguous();
  if (tokens.dtype() != DType::I32) PT_THROW(InputError, "embedding: token ids must be i32");
  Tensor local = Tensor::empty(tokens.shape(), DType::I32);
  const int32_t* t = tokens.data<int32_t>();
  int32_t* l = local.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    if (t[i] < 0 || t[i] >= vocab_)
      PT_THROW(InputError, "embedding: token id ", t[i], " is outside the vocabulary of ", vocab_);
    l[i] = (t[i] >= start_ && t[i] < start_ + rows_) ? static_cast<int32_t>(t[i] - start_) : -1;
  }
  const Tensor partial = masked_lookup(local, weight);
  return sp_ ? reduce_scatter_sequence(partial, tp_) : reduce_from_tp(partial, tp_);
}

Tensor VocabParallelEmbedding::forward_with_positions(const Tensor& tokens, const nn::Embedding& positions) const {
  if (tokens.dim() != 2) PT_THROW(InputError, "embedding: tokens must be (B,T), got ", shape_str(tokens.shape()));
  const Tensor x = forward(tokens);  // (B, T, C), or (B, T/n, C) with the sequence split
  const int64_t B = x.size(0), Tl = x.size(1), first = sp_ ? Tl * tp_->rank() : 0;
  std::vector<int32_t> pos(static_cast<size_t>(B * Tl));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t) pos[b * Tl + t] = static_cast<int32_t>(first + t);
  const Tensor table = sp_ ? copy_to_tp(positions.weight, tp_) : positions.weight;
  return ops::add(x, ops::embedding(Tensor::from_vector_i32(pos, {B, Tl}), table));
}

Tensor VocabParallelEmbedding::local_logits(const Tensor& hidden) const {
  const Tensor h = sp_ ? gather_sequence(hidden, tp_) : copy_to_tp(hidden, tp_);
  return ops::matmul(h, weight, /*trans_b=*/true);  // (B, T, V/n): this rank's columns only
}

Tensor VocabParallelEmbedding::tied_logits(const Tensor& hidden) const {
  autograd::NoGradGuard no_grad;
  const Tensor all = gather_last_dim(local_logits(hidden), tp_).contiguous();  // (B, T, padded V)
  const int64_t padded = all.size(-1), rows = all.numel() / padded;
  Shape shape = all.shape();
  shape.back() = vocab_;
  Tensor out = Tensor::empty(shape, all.dtype());
  const size_t esz = dtype_size(all.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(out.data_ptr()) + r * vocab_ * esz,
                static_cast<const char*>(all.data_ptr()) + r * padded * esz, static_cast<size_t>(vocab_) * esz);
  return out;
}

Tensor VocabParallelEmbedding::tied_loss(const Tensor& hidden, const Tensor& targets) const {
  return vocab_parallel_cross_entropy(local_logits(hidden), targets, start_, vocab_, tp_);
}

SequenceParallelLayerNorm::SequenceParallelLayerNorm(const nn::LayerNorm& whole, std::shared_ptr<TpGroup> tp)
    : nn::LayerNorm(whole.weight.numel(), whole.eps), tp_(std::move(tp)) {
  autograd::NoGradGuard no_grad;
  weight.copy_(whole.weight.detach());
  bias.copy_(whole.bias.detach());
}

Tensor SequenceParallelLayerNorm::forward(const Tensor& x) const {
  return ops::layer_norm(x, copy_to_tp(weight, tp_), copy_to_tp(bias, tp_), eps);
}

SequenceParallelDropout::SequenceParallelDropout(const nn::Dropout& whole, std::shared_ptr<TpGroup> tp)
    : nn::Dropout(whole.p(), whole.generator()), tp_(std::move(tp)) {}

Tensor SequenceParallelDropout::forward(const Tensor& x) const {
  if (!is_training() || p() == 0.0f) return x;
  // The mask one process would draw for the whole (B, T, C), from the same generator (every
  // tp rank draws it, so the generators stay equal), and this rank's rows of it.
  Shape full = x.shape();
  const int64_t Tl = x.size(1);
  full[1] = Tl * tp_->size();
  Tensor whole_mask;
  {
    autograd::NoGradGuard no_grad;
    whole_mask = ops::dropout(Tensor::full(full, 1.0), p(), true, generator());
  }
  const Tensor mine = whole_mask.narrow(1, Tl * tp_->rank(), Tl).contiguous();
  return ops::mul(x, mine);
}

}  // namespace paratrain::parallel
