// The reduction step of the nccl backend's rank-ordered (deterministic) collectives
// (ProcessGroupOptions::deterministic; nccl_process_group.h says how the collectives use it).
//
// reduce_in_rank_order: out[i] = x_0[i] op x_1[i] op ... op x_(n-1)[i], combined strictly in
// rank order 0..n-1 in the shm/tcp accumulator (f32 for f32/bf16/f16, the integer type
// itself for i32/i64), divided by n for avg and rounded once: the same bits as
// comm/algorithms/reduce_kernels.h's acc_load/acc_add/acc_store on the CPU. x_rank is `own`;
// x_p for every other p is slots + p * stride (elements of dtype). `out` may be `own`.
// Enqueued on `stream`; nothing waits. len == 0 launches nothing.
// Thread-safety: any thread; the buffers must stay valid until the stream has run it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "paratrain/comm/types.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm::nccl {

void reduce_in_rank_order(const void* own, int rank, const void* slots, size_t stride, int n, void* out, size_t len,
                          DType dtype, ReduceOp op, cudaStream_t stream);

}  // namespace paratrain::comm::nccl
