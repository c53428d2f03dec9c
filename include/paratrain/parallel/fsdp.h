// FullyShardedDataParallel: ZeRO stage 3 (FSDP). Each data-parallel rank keeps 1/W of every
// parameter; a unit's parameters exist whole only while the unit computes (docs/ddp.md,
// "ZeRO 3").
//
// Units. The caller names submodules of the root module, in forward order (for a GPT: its
// blocks); every other parameter belongs to the root unit (for a GPT: the embeddings, the
// final LayerNorm and the tied head). A unit's parameters, in registration order, are laid
// out in one flat f32 buffer padded to W equal blocks; rank r keeps block r (its `shard`)
// and its piece of every parameter there (ShardPiece, gradient_shards.h). Between steps the
// parameters' storages point at nothing (Storage::rebind): no rank holds the whole model.
//
// One step (the same calls as DistributedDataParallel):
//   fsdp.zero_grad();
//   for k in 0..K-1: { optional<NoSync> ns; if (k < K-1) ns.emplace(fsdp.no_sync());
//                      autograd::backward(loss_k, seed fsdp.backward_seed(K)); }
//   fsdp.finish();                 // this rank's shard of the mean gradient
//   ZeroOptimizer over zero_pieces(fsdp): norm, clip, step on the shards.
// Forward: a forward wrapper (nn::Module::add_forward_wrapper) on each unit all-gathers its
// shards into a flat buffer and points its parameters into it, issues the gather of the
// next `prefetch` units (overlapping this unit's compute), runs the unit and, with
// reshard_after_forward, frees the buffer again. The root unit is gathered around the root
// module's forward and kept until its gradients are reduced (the head needs it last and the
// embedding first). Backward: an identity on each unit's output gathers the unit again (and
// prefetches the one before it) before its backward runs and points .grad at a zeroed flat
// gradient buffer; when the unit's last parameter gradient is final (grad-ready hooks) the
// buffer is reduce-scattered into this rank's gradient shard and the parameters are freed.
// Reduce-scatters are launched in one fixed order (units last to first, then the root) so
// every rank issues the same collectives. Gradient accumulation: inside no_sync() the full
// gradient buffers are kept and accumulate, and nothing is reduce-scattered until the
// synchronised pass (memory: one whole gradient during accumulation).
//
// Deterministic mode (rank-ordered group): each pass's gradient goes into an accumulator in
// pass order and the reduce-scatter sums in rank order, exactly as DistributedDataParallel's
// deterministic ZeRO, so a run is bit-identical to plain data parallelism. Otherwise the sum
// differs from it by rounding only.
//
// Without a group (or a group of one) the same code runs with local copies.
//
// Thread-safety: one thread drives it (forward, backward and these calls). Lifetime: the
// root module must outlive it; the wrappers and hooks it installs are removed or become
// no-ops when it is destroyed, after which the parameters hold no memory (take full_state()
// first). Every wait has a deadline (options.timeout_s, else the group's own).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/nn/module.h"
#include "paratrain/parallel/gradient_shards.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::parallel {

struct FsdpOptions {
  bool reshard_after_forward = true;  // free a unit after its forward (false: keep it until its backward)
  int prefetch = 1;                   // units whose gather is issued ahead of the one computing (0: none)
  bool deterministic = false;         // rank-ordered sums (needs a group with options().deterministic)
  bool broadcast_parameters = true;   // take rank 0's values at construction
  double timeout_s = 0;               // deadline of every wait; 0 = the group's own
  // F32, or BF16/F16: each rank's shard is rounded to that type for the all-gather (every rank
  // then computes with the same rounded parameters, as PyTorch FSDP's param_dtype), and the
  // gradient is averaged, rounded and reduce-scattered in it (as DDP's --compress bf16|fp16).
  // Half the bytes; the shards and the optimizer stay f32. Not with deterministic.
  DType comm_dtype = DType::F32;
};

// The last step's communication (forward, backward and finish), milliseconds and bytes.
struct FsdpStepStats {
  double gather_ms = 0;                  // time the all-gathers ran (on the group's thread)
  double gather_exposed_ms = 0;          // of which compute waited for them
  double reduce_scatter_ms = 0;          // likewise for the gradient reduce-scatters
  double reduce_scatter_exposed_ms = 0;
  int64_t gathers = 0, reduce_scatters = 0;
  int64_t gather_bytes = 0, reduce_scatter_bytes = 0;  // whole flat buffers (W blocks) as sent
  int64_t peak_gathered_units = 0;  // most units gathered (or being gathered) at once, root included
  int64_t peak_gathered_bytes = 0;  // their parameter bytes
};

// Per-rank memory, bytes (local; no communication).
struct FsdpMemory {
  int64_t parameter_shard_bytes = 0;  // this rank's parameter shards
  int64_t gradient_shard_bytes = 0;   // this rank's gradient shards
  int64_t parameter_bytes = 0;        // the whole model's parameters (what ZeRO 0-2 hold per rank)
  int64_t largest_unit_bytes = 0;     // the biggest gathered unit
  int64_t gathered_bytes = 0;         // gathered parameter buffers held now
  int64_t gradient_bytes = 0;         // gradient buffers held now (full buffers in flight + shards)
};

class FullyShardedDataParallel : public GradientShards {
 public:
  // Collective over `pg` (may be null). `units` are submodules of `root` whose parameters
  // are disjoint; `root` and every unit must run forward wrappers. InputError for a unit
  // that is not inside root, a module without wrapper support, a parameter that is not
  // f32, contiguous and alone in its storage, or ranks holding different models.
  FullyShardedDataParallel(nn::Module& root, const std::vector<nn::Module*>& units,
                           std::shared_ptr<comm::ProcessGroup> pg, FsdpOptions options = {});
  ~FullyShardedDataParallel() override;
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  int rank() const;
  int world_size() const;
  const FsdpOptions& options() const;

  // Starts a step: waits for anything left, drops the gradients of the last one.
  void zero_grad();

  using NoSync = NoSyncScope;
  NoSync no_sync();

  // 1/grad_accum normally, 1 in deterministic mode (finish() divides instead).
  float backward_seed(int64_t grad_accum) const;
  // Ends the synchronised backward: waits for every reduce-scatter (deadline), scales the
  // shards, frees what is still gathered. InputError naming parameters that got no gradient.
  void finish();
  const FsdpStepStats& last_stats() const;
  FsdpMemory memory() const;

  // Whole copies of every parameter (names as root.named_parameters()), gathered unit by
  // unit. Collective; for --save-final and sampling.
  std::map<std::string, Tensor> full_state();
  // This rank's pieces of the parameters (1-D, by parameter name; none for a parameter it
  // owns nothing of): what a checkpoint shard holds. Local.
  std::map<std::string, Tensor> parameter_pieces() const;
  // Keeps this rank's pieces of a whole state (e.g. load_training_state()'s model). Local.
  // InputError naming a missing tensor or one of another shape; nothing is changed then.
  void load_full_state(const std::map<std::string, Tensor>& state);
  // The caller's units and the root unit.
  int64_t num_units() const;

  // ---- GradientShards ----
  std::vector<ShardPiece> shard_pieces() const override;
  void publish_parameters() override {}  // the next forward gathers the updated shards
  int64_t gradient_bytes() const override;
  const std::shared_ptr<comm::ProcessGroup>& process_group() const override;
  nn::Module& module() override { return root_; }
  const nn::Module& module() const override { return root_; }
  int zero_stage() const override { return 3; }

  struct Impl;

 private:
  nn::Module& root_;
  std::vector<nn::Module*> units_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace paratrain::parallel
