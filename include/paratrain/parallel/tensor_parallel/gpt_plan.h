// The tensor-parallel plan of the GPT (torchtitan's way): the model stays layout-free, and
// parallelize_gpt() replaces its named layers with the parallel ones of layers.h, each
// holding this rank's slice of the weights the whole layer held.
//
//   wte                      VocabParallelEmbedding (and the tied head + vocab-parallel loss)
//   h.{i}.attn.c_attn        ColumnParallelLinear, q, k and v cut separately (n_head/tp
//                            whole heads per rank); attn.n_head becomes n_head / tp
//   h.{i}.attn.c_proj        RowParallelLinear
//   h.{i}.mlp.c_fc           ColumnParallelLinear
//   h.{i}.mlp.c_proj         RowParallelLinear
//   with sequence parallelism also h.{i}.ln_1, ln_2, drop and ln_f (their sequence-split
//   versions); wpe and the LayerNorms stay replicated.
// Per block: one all-reduce forward and one backward for attention, the same for the MLP
// (or a reduce-scatter + all-gather pair each with sequence parallelism).
//
// A run builds the whole model on every rank (same seed: the same weights as one process),
// loads --init-from or a checkpoint into it, then applies the plan, so the weights never
// depend on the layout. The plan also knows how every tensor is cut (cuts()), which the
// checkpoint files record and the gradient norm needs.
//
// Thread-safety: as nn::Module. Lifetime: the plan holds the TpGroup the layers share.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "paratrain/checkpoint/tensor_cut.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/tensor_parallel/comm_ops.h"

namespace paratrain::parallel {

struct TensorParallelOptions {
  bool sequence_parallel = false;  // LayerNorm and dropout on T/tp of the sequence
};

// InputError naming the numbers when `cfg` cannot be cut over tp ranks: n_head or n_embd not
// divisible by tp, or (sequence parallelism) block_size not divisible by tp.
void check_tensor_parallel_layout(const nn::GPTConfig& cfg, int tp, bool sequence_parallel);

class TensorParallelPlan {
 public:
  TensorParallelPlan() = default;
  TensorParallelPlan(std::shared_ptr<TpGroup> tp, std::map<std::string, checkpoint::TensorCut> cuts)
      : tp_(std::move(tp)), cuts_(std::move(cuts)) {}

  const std::shared_ptr<TpGroup>& group() const { return tp_; }
  int size() const { return tp_ ? tp_->size() : 1; }
  // The cut of every parameter that is not replicated.
  const std::map<std::string, checkpoint::TensorCut>& cuts() const { return cuts_; }
  // The cut of a parameter "<name>" or of its optimizer state "<name>.<state>" (replicated
  // when neither is in cuts()).
  checkpoint::TensorCut cut_of(const std::string& key) const;
  bool sharded(const std::string& key) const { return !cut_of(key).replicated(); }

  // Whole tensors from this rank's parts (parameters or optimizer state, by key): collective
  // over the tp group, every rank gets the whole (without tensor parallelism: `local` itself).
  // Parts may be on a GPU (gathered there); the joined whole tensors are host tensors, the
  // replicated ones are returned as they are (on their device).
  std::map<std::string, Tensor> gather_whole(const std::map<std::string, Tensor>& local) const;
  // This rank's parts of whole tensors (without tensor parallelism: `whole` itself). Local.
  // The parts are host tensors (cut on the host whatever the whole's device).
  std::map<std::string, Tensor> cut_local(const std::map<std::string, Tensor>& whole) const;

 private:
  std::shared_ptr<TpGroup> tp_;
  std::map<std::string, checkpoint::TensorCut> cuts_;
};

// Replaces the model's layers as listed above. `tp` null or of one rank: nothing changes
// (the plan then has no cuts). Call once, before DistributedDataParallel or an optimizer is
// built over the parameters (they are new tensors).
TensorParallelPlan parallelize_gpt(nn::GPT& model, std::shared_ptr<comm::ProcessGroup> tp,
                                   const TensorParallelOptions& options = {});

}  // namespace paratrain::parallel
