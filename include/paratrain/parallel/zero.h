// ZeRO stages 1, 2 and 3: optimizer state (stage 1), gradients (stage 2) and parameters
// (stage 3, fsdp.h) sharded over the data-parallel ranks, with results equal to plain data
// parallelism (docs/ddp.md, "ZeRO"). ZeroOptimizer drives any GradientShards
// (gradient_shards.h): DistributedDataParallel with zero_stage 1|2, described below, or
// FullyShardedDataParallel (stage 3), whose pieces are views into its parameter shards.
//
// Layout. DistributedDataParallel built with DdpOptions::zero_stage = 1|2 pads each gradient
// bucket to W equal blocks (W = world size); rank r owns block r of every bucket, i.e. one
// contiguous piece of some of the parameters (DistributedDataParallel::shard_pieces()). The
// layout is fixed at construction (buckets are never re-ordered) and does not depend on
// timing, so every rank computes the same one.
//
// One optimizer step:
//   ddp.zero_grad();  backward...;  ddp.finish();  // reduce-scatter: this rank's shard of the mean
//   const double norm = zero.grad_norm();           // collective: the global L2 norm
//   zero.clip_grad_norm(max_norm, norm);            // torch's rule, on the shard
//   zero.step();                                    // update own pieces, publish_parameters()
//
// The inner optimizer (optim::AdamW, optim::SGD, ...) is an ordinary one built over
// zero_pieces(ddp): 1-D views of the owned elements, each with .grad a view of the gradient
// shard. ZeroOptimizer gives it the whole parameters' dims (weight decay of 2-D weights only),
// so each element sees exactly the arithmetic (the same kernel) of the unsharded optimizer and
// holds state only for 1/W of the elements. With the rank-ordered reduce-scatter
// (deterministic mode) the result is bit-identical to DistributedDataParallel + the same
// optimizer; otherwise it matches to rounding (the reduction order of the collective).
//
// Checkpoints: shard_state() is this rank's piece of the state with each piece's place in its
// parameter; load_state() takes the whole (unsharded) state, as load_training_state()
// assembles it from any number of shards, and keeps this rank's pieces, so a run may resume on
// another number of ranks.
//
// Thread-safety: as the wrapper (one thread drives it). Lifetime: the wrapper and the
// optimizer must outlive it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/checkpoint/training_state.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/ddp.h"
#include "paratrain/parallel/gradient_shards.h"

namespace paratrain::parallel {

// This rank's pieces of the parameters as named 1-D tensors (the parameters' names), each
// with .grad the matching view of the rank's gradient shard: what the inner optimizer of a
// ZeroOptimizer is built over. InputError when nothing is sharded (zero_stage 0).
optim::NamedParams zero_pieces(GradientShards& shards);

// Memory of one rank, bytes.
struct ZeroMemory {
  int64_t optimizer_bytes = 0;            // this rank's optimizer state
  int64_t optimizer_unsharded_bytes = 0;  // what one rank would hold without sharding (0 when it owns nothing)
  int64_t gradient_bytes = 0;             // gradient buffers held now (ddp.gradient_bytes())
  int64_t gradient_shard_bytes = 0;       // of which this rank's reduced shard (its pieces)
};

class ZeroOptimizer {
 public:
  // `opt` must have been built over zero_pieces(shards), in that order (InputError otherwise).
  ZeroOptimizer(GradientShards& shards, optim::Optimizer& opt);
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  int stage() const { return stage_; }
  optim::Optimizer& optimizer() { return opt_; }

  // The global L2 norm of the averaged gradient: each rank's sum of squares over its shard
  // (f64), gathered and added in rank order. Collective; call after ddp.finish().
  double grad_norm();
  // Scales the shard by min(1, max_norm / (norm + 1e-6)) when norm > max_norm (as
  // optim::clip_grad_norm; max_norm <= 0 = off). Local.
  void clip_grad_norm(double max_norm, double norm);
  // The inner optimizer's step on this rank's pieces, then shards.publish_parameters()
  // (collective for stages 1 and 2).
  void step();

  // This rank's optimizer state and where each piece sits in its parameter.
  checkpoint::OptimizerShard shard_state() const;
  // Loads this rank's pieces from the whole state ("<param>.<state>" tensors of the full
  // parameter shapes, e.g. from load_training_state()) and the step count. InputError naming
  // the tensor when one is missing or has another number of elements; nothing is changed then.
  void load_state(const std::map<std::string, Tensor>& full, int64_t steps_taken);

  // Local; no communication.
  ZeroMemory memory() const;

 private:
  GradientShards& shards_;
  optim::Optimizer& opt_;
  int stage_ = 0;
  std::vector<ShardPiece> pieces_;
};

}  // namespace paratrain::parallel
