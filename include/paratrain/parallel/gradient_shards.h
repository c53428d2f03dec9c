// GradientShards: what a ZeRO optimizer step needs from the data-parallel wrapper that holds
// the gradients -- each rank's pieces of the parameters and of the averaged gradient, and
// the group they are sharded over (zero.h).
//
// Two wrappers provide it: DistributedDataParallel with zero_stage 1|2 (ddp.h: parameters
// whole on every rank, gradients reduce-scattered into shards) and FullyShardedDataParallel
// (fsdp.h, ZeRO 3: the parameters themselves live only as shards). A piece is the
// intersection of one parameter with the block of a flat, padded buffer that a rank owns;
// at most one piece per parameter and rank. The layout is fixed at construction and the
// same on every rank.
//
// Thread-safety and lifetime: as the wrapper (one thread drives it; it must outlive the
// optimizer built over its pieces).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/nn/module.h"

namespace paratrain::parallel {

struct ShardPiece {
  std::string name;   // the parameter's name
  Tensor param;       // 1-D view of this rank's elements [begin, begin + numel) of the parameter
                      // (ZeRO 1/2: inside the parameter itself; ZeRO 3: inside the shard)
  Tensor grad;        // 1-D view of the same elements of this rank's reduced gradient shard
                      // (valid after the wrapper's finish() until the next zero_grad())
  int64_t begin = 0;  // first element of the piece in the flattened parameter
  Shape shape;        // the whole parameter's shape
};

// While it lives, a data-parallel wrapper's backward passes accumulate locally and
// communicate nothing (DistributedDataParallel::no_sync(), FullyShardedDataParallel::no_sync()).
// Restores the previous state when destroyed; movable, not copyable.
class NoSyncScope {
 public:
  explicit NoSyncScope(bool& no_sync) : flag_(&no_sync), prev_(no_sync) { no_sync = true; }
  ~NoSyncScope() {
    if (flag_) *flag_ = prev_;
  }
  NoSyncScope(NoSyncScope&& other) noexcept : flag_(other.flag_), prev_(other.prev_) { other.flag_ = nullptr; }
  NoSyncScope(const NoSyncScope&) = delete;
  NoSyncScope& operator=(const NoSyncScope&) = delete;
  NoSyncScope& operator=(NoSyncScope&&) = delete;

 private:
  bool* flag_;
  bool prev_;
};

class GradientShards {
 public:
  virtual ~GradientShards() = default;
  // This rank's pieces, in the wrapper's fixed order.
  virtual std::vector<ShardPiece> shard_pieces() const = 0;
  // After the pieces were updated in place: makes the update visible to the next forward
  // (ZeRO 1/2: all-gathers the parameters, collective; ZeRO 3: nothing, the next forward
  // gathers the shards).
  virtual void publish_parameters() = 0;
  // Bytes of gradient buffers this rank holds now.
  virtual int64_t gradient_bytes() const = 0;
  // The group the pieces are sharded over (null: one process).
  virtual const std::shared_ptr<comm::ProcessGroup>& process_group() const = 0;
  virtual nn::Module& module() = 0;
  virtual const nn::Module& module() const = 0;
  // 1, 2 or 3; 0 when nothing is sharded.
  virtual int zero_stage() const = 0;
};

}  // namespace paratrain::parallel
