// Tensor-parallel layers (Megatron-LM): each holds this rank's slice of a whole layer's
// parameters, under the whole layer's parameter names, and puts the collectives of
// comm_ops.h where the arithmetic needs them. A plan (gpt_plan.h) builds them from the
// whole layers and puts them in their place in the model.
//
//   ColumnParallelLinear  weight (in, out/n), bias (out/n): input f (or, with sequence
//                         parallelism, all-gather along the sequence), output sharded along
//                         features. `blocks` = 3 cuts each of q, k and v separately.
//   RowParallelLinear     weight (in/n, out), bias (out) replicated: input sharded along
//                         features, partial products reduced by g (or reduce-scattered
//                         along the sequence), then the bias added once.
//   VocabParallelEmbedding  rows [r*V/n, (r+1)*V/n) of the vocabulary padded to a multiple
//                         of n (padding rows zero; they never change the loss): masked lookup
//                         + g (or reduce-scatter); the tied LM head computes only this rank's
//                         logits and the loss is the vocab-parallel cross-entropy.
//   SequenceParallelLayerNorm / SequenceParallelDropout
//                         the same arithmetic on this rank's part of the sequence (B, T/n, C);
//                         the LayerNorm's parameters pass through f so that their gradient
//                         sums every rank's part; the dropout mask is this rank's slice of
//                         the mask one process would draw, so masks do not depend on the
//                         layout.
//
// Devices: a layer lives on the device of the whole layer it was built from (its slices are
// cut on the host and copied there, once) and computes there with the kernels of its tensors'
// device: the vocabulary-parallel lookup is the vocab_embedding kernel pair (token ids checked
// against the whole vocabulary; a GPU waits for that check, as nn::Embedding's does).
//
// Thread-safety and lifetime: as nn::Module; the TpGroup is shared.
#pragma once

#include <memory>

#include "paratrain/checkpoint/tensor_cut.h"
#include "paratrain/nn/layers.h"
#include "paratrain/parallel/tensor_parallel/comm_ops.h"

namespace paratrain::parallel {

class ColumnParallelLinear final : public nn::Linear {
 public:
  // `whole` must use the (in, out) layout; its parameters are copied, sliced.
  ColumnParallelLinear(const nn::Linear& whole, int blocks, std::shared_ptr<TpGroup> tp, bool sequence_parallel);
  Tensor forward(const Tensor& x) const override;
  Tensor forward_gelu(const Tensor& x) const override;  // the GELU on this rank's columns, fused
  checkpoint::TensorCut weight_cut() const { return {1, blocks_, 0}; }
  checkpoint::TensorCut bias_cut() const { return {0, blocks_, 0}; }

 private:
  int blocks_;
  std::shared_ptr<TpGroup> tp_;
  bool sp_;
};

class RowParallelLinear final : public nn::Linear {
 public:
  RowParallelLinear(const nn::Linear& whole, std::shared_ptr<TpGroup> tp, bool sequence_parallel);
  Tensor forward(const Tensor& x) const override;
  checkpoint::TensorCut weight_cut() const { return {0, 1, 0}; }

 private:
  std::shared_ptr<TpGroup> tp_;
  bool sp_;
};

class VocabParallelEmbedding final : public nn::Embedding {
 public:
  VocabParallelEmbedding(const nn::Embedding& whole, std::shared_ptr<TpGroup> tp, bool sequence_parallel);
  Tensor forward(const Tensor& tokens) const override;
  Tensor forward_with_positions(const Tensor& tokens, const nn::Embedding& positions) const override;
  // The whole (B,T,V) logits, gathered: for generation and inspection, not differentiable.
  Tensor tied_logits(const Tensor& hidden) const override;
  Tensor tied_loss(const Tensor& hidden, const Tensor& targets) const override;
  checkpoint::TensorCut weight_cut() const { return {0, 1, vocab_}; }
  int64_t vocab_size() const { return vocab_; }
  int64_t vocab_start() const { return start_; }

 private:
  // The head's input on this rank: the whole sequence (gathered with sequence parallelism),
  // its gradient reduced over tp.
  Tensor head_input(const Tensor& hidden) const;
  Tensor local_logits(const Tensor& hidden) const;
  // The (B, Tl) position ids first..first+Tl-1 on `device`, kept for the next call of that shape.
  const Tensor& position_ids(int64_t B, int64_t Tl, int64_t first, const DeviceSpec& device) const;
  struct PositionIds {
    int64_t B = 0, Tl = 0, first = 0;
    DeviceSpec device;
    Tensor ids;
  };
  mutable PositionIds positions_;
  int64_t vocab_ = 0, start_ = 0, rows_ = 0;
  std::shared_ptr<TpGroup> tp_;
  bool sp_;
};

class SequenceParallelLayerNorm final : public nn::LayerNorm {
 public:
  SequenceParallelLayerNorm(const nn::LayerNorm& whole, std::shared_ptr<TpGroup> tp);
  Tensor forward(const Tensor& x) const override;

 private:
  std::shared_ptr<TpGroup> tp_;
};

class SequenceParallelDropout final : public nn::Dropout {
 public:
  SequenceParallelDropout(const nn::Dropout& whole, std::shared_ptr<TpGroup> tp);
  Tensor forward(const Tensor& x) const override;

 private:
  std::shared_ptr<TpGroup> tp_;
};

}  // namespace paratrain::parallel
