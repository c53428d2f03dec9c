#include "paratrain/parallel/tensor_parallel/layers.h"

#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"

namespace paratrain::parallel {

namespace {

// Rows of `table` (R, C), rows [start, start+R) of a vocabulary of `vocab`, for token ids (any
// shape, i32, in [0, vocab): InputError otherwise) -> (ids..., C); ids of other ranks' rows
// give zeros. Backward adds each row's gradient into its table row, in position order on the
// CPU (f32 atomics on a GPU). The vocab_embedding kernels on the table's device.
Tensor vocab_lookup(const Tensor& tokens_in, const Tensor& table, int64_t vocab, int64_t start) {
  if (tokens_in.dtype() != DType::I32)
    PT_THROW(InputError, "embedding: token ids must be i32, got ", dtype_name(tokens_in.dtype()));
  if (tokens_in.device_spec() != table.device_spec())
    PT_THROW(InputError, "embedding: tokens are on ", tokens_in.device_spec().str(), " but the weight is on ",
             table.device_spec().str(), " (move the module with Module::to, the data with Tensor::to)");
  if (table.dtype() != DType::F32)
    PT_THROW(InputError, "embedding: the weight must be f32, got ", dtype_name(table.dtype()));
  const Tensor tokens = tokens_in.contiguous();
  const Tensor w = table.contiguous();
  const int64_t R = w.size(0), C = w.size(1), N = tokens.numel();
  Shape out_shape = tokens.shape();
  out_shape.push_back(C);
  Tensor out = w.new_empty(out_shape);
  kernels::kernel(&kernels::Registry::vocab_embedding_forward, w)(out.data_ptr(), tokens.data<int32_t>(), w.data_ptr(),
                                                                   N, vocab, start, R, C);
  if (autograd::any_requires_grad({&table})) {
    const Shape tshape = table.shape();
    autograd::record(std::make_shared<autograd::LambdaNode>(
                         "vocab_parallel_embedding",
                         [tokens, tshape, N, vocab, start, R, C, device = w.device_spec()](std::vector<Tensor>& g) {
                           Tensor dw = Tensor::zeros(tshape, DType::F32, device);
                           if (!g[0].defined()) return std::vector<Tensor>{dw};
                           const Tensor go = g[0].to(DType::F32).contiguous();
                           kernels::kernel(&kernels::Registry::vocab_embedding_backward, dw)(
                               dw.data_ptr(), go.data_ptr(), tokens.data<int32_t>(), N, vocab, start, R, C);
                           return std::vector<Tensor>{dw};
                         }),
                     {&table}, {&out});
  }
  return out;
}

// cut_tensor for a tensor on any device: cut on the host, the part back on `whole`'s device
// (built once, when a plan replaces the layers).
Tensor cut_like(const Tensor& whole, const checkpoint::TensorCut& cut, int rank, int count) {
  const DeviceSpec device = whole.device_spec();
  const Tensor part = checkpoint::cut_tensor(whole.to(DeviceSpec{}), cut, rank, count);
  return device.kind == Device::CPU ? part : part.to(device);
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& whole, int blocks, std::shared_ptr<TpGroup> tp,
                                           bool sequence_parallel)
    : blocks_(blocks), tp_(std::move(tp)), sp_(sequence_parallel) {
  if (whole.layout != nn::WeightLayout::InOut)
    PT_THROW(InputError, "ColumnParallelLinear: the whole layer must use the (in, out) weight layout");
  layout = nn::WeightLayout::InOut;
  weight = register_parameter("weight", cut_like(whole.weight.detach(), weight_cut(), tp_->rank(), tp_->size()));
  if (whole.bias.defined())
    bias = register_parameter("bias", cut_like(whole.bias.detach(), bias_cut(), tp_->rank(), tp_->size()));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  const Tensor in = sp_ ? gather_sequence(x, tp_) : copy_to_tp(x, tp_);
  return ops::linear(in, weight, bias, /*in_out_layout=*/true);
}

Tensor ColumnParallelLinear::forward_gelu(const Tensor& x) const {
  if (!bias.defined()) return ops::gelu(forward(x));
  const Tensor in = sp_ ? gather_sequence(x, tp_) : copy_to_tp(x, tp_);
  return ops::linear_gelu(in, weight, bias, /*in_out_layout=*/true);
}

RowParallelLinear::RowParallelLinear(const nn::Linear& whole, std::shared_ptr<TpGroup> tp, bool sequence_parallel)
    : tp_(std::move(tp)), sp_(sequence_parallel) {
  if (whole.layout != nn::WeightLayout::InOut)
    PT_THROW(InputError, "RowParallelLinear: the whole layer must use the (in, out) weight layout");
  layout = nn::WeightLayout::InOut;
  weight = register_parameter("weight", cut_like(whole.weight.detach(), weight_cut(), tp_->rank(), tp_->size()));
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
  weight = register_parameter("weight", cut_like(whole.weight.detach(), weight_cut(), tp_->rank(), tp_->size()));
  rows_ = weight.size(0);
  start_ = rows_ * tp_->rank();
}

Tensor VocabParallelEmbedding::forward(const Tensor& tokens) const {
  const Tensor partial = vocab_lookup(tokens, weight, vocab_, start_);
  return sp_ ? reduce_scatter_sequence(partial, tp_) : reduce_from_tp(partial, tp_);
}

Tensor VocabParallelEmbedding::forward_with_positions(const Tensor& tokens, const nn::Embedding& positions) const {
  if (tokens.dim() != 2) PT_THROW(InputError, "embedding: tokens must be (B,T), got ", shape_str(tokens.shape()));
  const Tensor x = forward(tokens);  // (B, T, C), or (B, T/n, C) with the sequence split
  const int64_t B = x.size(0), Tl = x.size(1), first = sp_ ? Tl * tp_->rank() : 0;
  const Tensor table = sp_ ? copy_to_tp(positions.weight, tp_) : positions.weight;
  return ops::add(x, ops::embedding(position_ids(B, Tl, first, table.device_spec()), table));
}

const Tensor& VocabParallelEmbedding::position_ids(int64_t B, int64_t Tl, int64_t first, const DeviceSpec& device) const {
  PositionIds& c = positions_;
  if (c.ids.defined() && c.B == B && c.Tl == Tl && c.first == first && c.device == device) return c.ids;
  std::vector<int32_t> pos(static_cast<size_t>(B * Tl));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t) pos[b * Tl + t] = static_cast<int32_t>(first + t);
  c = {B, Tl, first, device, Tensor::from_vector_i32(pos, {B, Tl}).to(device)};
  return c.ids;
}

Tensor VocabParallelEmbedding::head_input(const Tensor& hidden) const {
  return sp_ ? gather_sequence(hidden, tp_) : copy_to_tp(hidden, tp_);
}

Tensor VocabParallelEmbedding::local_logits(const Tensor& hidden) const {
  return ops::matmul(head_input(hidden), weight, /*trans_b=*/true);  // (B, T, V/n): this rank's columns only
}

Tensor VocabParallelEmbedding::tied_logits(const Tensor& hidden) const {
  autograd::NoGradGuard no_grad;
  const Tensor all = gather_last_dim(local_logits(hidden), tp_).contiguous();  // (B, T, padded V)
  const int64_t padded = all.size(-1), rows = all.numel() / padded;
  Shape shape = all.shape();
  shape.back() = vocab_;
  Tensor out = all.new_empty({rows, vocab_});
  out.copy_(all.view({rows, padded}).narrow(1, 0, vocab_));  // the padding columns dropped
  return out.view(shape);
}

Tensor VocabParallelEmbedding::tied_loss(const Tensor& hidden, const Tensor& targets) const {
  return vocab_parallel_linear_cross_entropy(head_input(hidden), weight, targets, start_, vocab_, tp_);
}

SequenceParallelLayerNorm::SequenceParallelLayerNorm(const nn::LayerNorm& whole, std::shared_ptr<TpGroup> tp)
    : nn::LayerNorm(whole.weight.numel(), whole.eps), tp_(std::move(tp)) {
  autograd::NoGradGuard no_grad;
  to(whole.weight.device_spec());  // the whole layer's device (made on the host above)
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
    whole_mask = ops::dropout(x.new_full(full, 1.0), p(), true, generator());
  }
  const Tensor mine = whole_mask.narrow(1, Tl * tp_->rank(), Tl).contiguous();
  return ops::mul(x, mine);
}

}  // namespace paratrain::parallel
