// The collectives tensor parallelism puts into the autograd graph (Megatron-LM's conjugate
// operators; REFERENCE.md, "Megatron tensor parallelism").
//
//   copy_to_tp        "f": identity forward, all-reduce (sum) of the gradient backward
//   reduce_from_tp    "g": all-reduce (sum) forward, identity backward
//   gather_sequence   sequence parallelism: x (B, T/n, ...) -> (B, T, ...) all-gather along
//                     dim 1 forward, reduce-scatter of the gradient backward
//   reduce_scatter_sequence
//                     x (B, T, ...) partial sums -> (B, T/n, ...) the sum of this rank's block
//                     of the sequence forward, all-gather of the gradient backward
//   gather_last_dim   x (..., V/n) -> (..., V) all-gather along the last dim (full logits for
//                     generation); backward keeps this rank's slice of the gradient
//
// Every op is a collective of its TpGroup: all ranks of the group must run the same ops in
// the same order, forward and backward (the GPT's graph is the same on every tp rank, so its
// backward issues them in the same order). With a group of one rank each op is the identity.
// f32, bf16 and f16 tensors (half types are reduced in f32 by shm/tcp/mpi; nccl rounds
// partial sums to the half type).
//
// Devices: every op allocates like its input (Tensor::new_empty) and moves data with tensor
// copies (views, permute, copy_), so the same code runs on the CPU and on a GPU; on the CPU
// the results are the bytes the group's collectives produce, rearranged, nothing computed.
// On a GPU the tensors go to the group's collectives as device pointers (nccl), and each
// collective orders the compute stream after itself (Work::wait_on_device) instead of
// blocking the host: the host goes on queueing work. A GPU tensor must be on the group's
// device (the nccl group's, cuda:LOCAL_RANK in training).
//
// Thread-safety: a TpGroup's statistics are updated by whoever runs its ops; one training
// thread drives forward and backward. Lifetime: layers hold the TpGroup by shared_ptr.
#pragma once

#include <cstdint>
#include <memory>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::parallel {

// Communication of the tensor-parallel ops since the last reset.
struct TpCommStats {
  double ms = 0;          // time spent in the collectives (forward and backward); with device
                          // buffers on nccl the time to enqueue them, not their run time
  int64_t bytes = 0;      // payload: each collective's full buffer size per rank (nccl-tests' S)
  int64_t calls = 0;
};

class TpGroup {
 public:
  // `pg` null or of size 1: one rank, every op is the identity.
  explicit TpGroup(std::shared_ptr<comm::ProcessGroup> pg) : pg_(std::move(pg)) {}
  int size() const { return pg_ ? pg_->size() : 1; }
  int rank() const { return pg_ ? pg_->rank() : 0; }
  comm::ProcessGroup* group() const { return pg_.get(); }

  const TpCommStats& stats() const { return stats_; }
  TpCommStats take_stats() {
    TpCommStats s = stats_;
    stats_ = {};
    return s;
  }

  // Collectives, timed into stats(); used by the ops below, the vocab-parallel loss and the
  // plan's gathers. Each returns once its result may be used by what the caller does next:
  // host buffers (and every buffer of a shm/tcp/mpi group) hold the result; device buffers on
  // nccl are ordered before later work on the compute stream (Work::wait_on_device), the host
  // does not wait. Raw pointers: `count` elements of `dtype`, host or device memory of the
  // group's device. With one rank allreduce does nothing.
  void allreduce(void* buf, size_t count, DType dtype, comm::ReduceOp op = comm::ReduceOp::kSum);
  // Tensors: contiguous (InputError otherwise); in and out of one dtype and device.
  // `buf` in place: the reduction over ranks.
  void allreduce(Tensor& buf, comm::ReduceOp op = comm::ReduceOp::kSum);
  // `in` (any shape) -> `out` with out.numel() == size() * in.numel(): rank i's `in` at
  // element offset i * in.numel(). With one rank: a copy.
  void allgather(const Tensor& in, Tensor& out);
  // `in` with in.numel() == size() * out.numel(): `out` = the sum over ranks of block rank()
  // of `in`. With one rank: a copy.
  void reduce_scatter(const Tensor& in, Tensor& out);

 private:
  std::shared_ptr<comm::ProcessGroup> pg_;
  TpCommStats stats_;
};

Tensor copy_to_tp(const Tensor& x, const std::shared_ptr<TpGroup>& tp);
Tensor reduce_from_tp(const Tensor& x, const std::shared_ptr<TpGroup>& tp);
Tensor gather_sequence(const Tensor& x, const std::shared_ptr<TpGroup>& tp);
Tensor reduce_scatter_sequence(const Tensor& x, const std::shared_ptr<TpGroup>& tp);
Tensor gather_last_dim(const Tensor& x, const std::shared_ptr<TpGroup>& tp);

}  // namespace paratrain::parallel
