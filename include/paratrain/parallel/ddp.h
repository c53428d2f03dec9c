// DistributedDataParallel: the same model on every rank, gradients averaged over ranks,
// communication overlapped with the backward pass (docs/ddp.md).
//
// Construction (collective over the group): every rank's parameter list (names, shapes,
// dtypes, in registration order) is fingerprinted and compared through an allgather; a
// difference is an InputError on every rank naming the first differing parameter on both
// sides. Then every parameter is broadcast from rank 0.
//
// Buckets: parameters are packed, in reverse order of registration (roughly the order the
// backward pass finishes them), into buckets of about `bucket_bytes` (the first one
// `first_bucket_bytes`, so communication starts early). Each bucket owns one flat f32 buffer
// and every parameter's .grad is a view into it, so the autograd engine accumulates straight
// into the buffer. A grad-ready hook (autograd/engine.h) marks each parameter ready; when a
// bucket's last parameter is ready (and every earlier bucket has been launched) its
// all-reduce starts asynchronously on the group's thread while backward continues. After the
// first synchronised step the buckets are rebuilt once in the order gradients actually
// became ready (rank 0's order, broadcast, so all ranks agree).
//
// One optimizer step:
//   ddp.zero_grad();                                 // zeroes the buckets, rebinds .grad
//   for k in 0..K-1:
//     std::optional<NoSync> ns; if (k < K-1) ns.emplace(ddp.no_sync());
//     autograd::backward(loss_k, seed ddp.backward_seed(K));
//   ddp.finish();                                    // waits; .grad = global mean gradient
//
// Modes:
//  - default: the backward seed is 1/K (the micro-batch losses are averaged locally), the
//    buckets are summed over ranks and finish() multiplies by 1/world.
//  - deterministic: each micro-step's gradient is computed unscaled (seed 1) into a zeroed
//    buffer and added, in micro-step order, to an accumulator; the accumulators are summed
//    over ranks in rank order 0..n-1 (the group must be created with `deterministic`), and
//    finish() multiplies by 1/(micro-steps x world). With one micro-step per rank this is
//    bit-identical to one process (a group of one, or no group) accumulating the same n
//    micro-batches in the same order.
//  - zero_stage 1 or 2 (ZeRO, docs/ddp.md): each bucket's flat buffer is padded to a multiple
//    of the world size W and cut into W equal blocks; instead of an all-reduce, a bucket's
//    collective is a reduce-scatter that leaves the sum of block r in rank r's `shard`
//    (launched from the hooks as above, so it still overlaps backward), and finish() scales
//    only that shard. The parameters' .grad are then unset: the averaged gradient exists only
//    as the ranks' shards (shard_pieces()). An optimizer over this rank's pieces updates them
//    in place and allgather_parameters() makes every parameter whole again (ZeroOptimizer,
//    zero.h). Stage 2 also releases the full-size bucket buffers at finish() (the next
//    zero_grad() takes them from the caching allocator again), so between steps a rank holds
//    only its 1/W of the gradients. Buckets are never re-ordered in these stages (the shard
//    layout stays fixed).
//  - find_unused_parameters: parameters that got no gradient in the synchronised backward
//    count as ready at finish() (their local gradient, zero if untouched, is reduced).
//    Without it, such parameters make finish() throw an InputError naming them (instead of
//    waiting forever for a bucket that can never be complete).
//
// A null group (or a group of one) communicates nothing; the gradient arithmetic is the
// same, which is how one process reproduces a data-parallel run bit for bit.
//
// Devices: the parameters may be on the CPU or on one GPU (cuda:N, with the nccl group); the
// buffers live with them and the steps above run as kernels on that GPU's compute stream
// (docs/ddp.md, "Parameters on a GPU"), gradient compression (fp16, bf16, PowerSGD) included.
//
// Thread-safety: one thread drives a DDP object (its backward passes and calls). Lifetime:
// the module must outlive it; the hooks it registers become no-ops when it is destroyed.
// Every wait has a deadline (DdpOptions::timeout_s, else the group's per-call deadline).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/nn/module.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/gradient_shards.h"

namespace paratrain::parallel {

struct DdpOptions {
  size_t bucket_bytes = size_t(25) << 20;       // target bucket size
  size_t first_bucket_bytes = size_t(1) << 20;  // the first bucket (last layers) is small
  bool find_unused_parameters = false;
  bool deterministic = false;  // rank-ordered sums (needs a group with options().deterministic)
  bool broadcast_parameters = true;  // copy rank 0's parameters to every rank at construction
  bool reorder_buckets = true;       // rebuild buckets once by the observed ready order
  int zero_stage = 0;                // 1|2: reduce-scatter into per-rank shards (ZeRO; header comment)
  double timeout_s = 0;              // finish() deadline per bucket; 0 = the group's deadline
  CompressOptions compress;          // what travels instead of f32 buckets (grad_compression.h)
  // Test hook (PARATRAIN_TEST_SKIP_ALLREDUCE): at this synchronised step (0-based count of
  // finish() calls) this rank does not launch its first bucket's all-reduce (plain f32 buckets
  // only), a collective its peers then wait for in vain; -1 = never.
  int64_t test_skip_allreduce_at = -1;
};

// Timings of the last finish(), in milliseconds.
struct DdpStepStats {
  double comm_ms = 0;          // first bucket launch to last bucket completion
  double exposed_comm_ms = 0;  // time finish() spent waiting (communication not hidden)
  int64_t buckets = 0;
  int64_t bytes = 0;  // bytes all-reduced
  int64_t bytes_uncompressed = 0;  // what f32 buckets would have been (= bytes without compress)
};

class DistributedDataParallel : public GradientShards {
 public:
  // Collective over `pg` (may be null: one process). Throws InputError on a parameter
  // mismatch across ranks, a non-f32 parameter, parameters on more than one device, GPU
  // parameters with a group that is not nccl (or the other way round) or with compression.
  DistributedDataParallel(nn::Module& module, std::shared_ptr<comm::ProcessGroup> pg, DdpOptions options = {});
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  nn::Module& module() override { return module_; }
  const nn::Module& module() const override { return module_; }
  int rank() const;
  int world_size() const;
  const DdpOptions& options() const;

  // Starts an optimizer step: applies a pending bucket rebuild (collective), zeroes every
  // bucket and points each parameter's .grad at its bucket view.
  void zero_grad();

  // While a NoSync lives, backward passes accumulate locally and communicate nothing.
  using NoSync = NoSyncScope;
  NoSync no_sync();

  // The backward seed for a loss that is one of `grad_accum` micro-batches of a step:
  // 1/grad_accum normally, 1 in deterministic mode (finish() divides instead).
  float backward_seed(int64_t grad_accum) const;

  // Ends the synchronised backward: launches what is left, waits for every bucket (deadline),
  // scales, and leaves the global mean gradient in every .grad. InputError naming the
  // parameters that got no gradient (without find_unused_parameters); the comm layer's
  // CommError/TimeoutError on a communication failure.
  void finish();

  const DdpStepStats& last_stats() const;
  // Parameter names per bucket, in launch order (for tests and docs).
  std::vector<std::vector<std::string>> bucket_names() const;
  // True once the buckets were rebuilt in ready order.
  bool buckets_rebuilt() const;

  // ---- ZeRO (zero_stage 1|2) ----
  using ShardPiece = parallel::ShardPiece;
  // This rank's pieces, in bucket order (empty unless zero_stage > 0).
  std::vector<ShardPiece> shard_pieces() const override;
  // After this rank's pieces were updated in place: gathers every rank's block of every
  // bucket so each parameter is whole and identical on all ranks. Collective; deadline as
  // finish(). A no-op without communication.
  void allgather_parameters();
  void publish_parameters() override { allgather_parameters(); }
  int zero_stage() const override;
  // Bytes of gradient buffers this rank holds now (buckets, accumulators, shards).
  int64_t gradient_bytes() const override;
  // The group it reduces over (null: one process).
  const std::shared_ptr<comm::ProcessGroup>& process_group() const override;

  struct Impl;

 private:
  nn::Module& module_;
  std::shared_ptr<Impl> impl_;
};

using NoSync = DistributedDataParallel::NoSync;

// 64-bit FNV-1a of a parameter's "name|dtype|shape" description (the DDP fingerprint).
uint64_t parameter_fingerprint(const std::string& name, const Tensor& t);

}  // namespace paratrain::parallel
