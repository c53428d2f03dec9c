// Small vocabulary types of the comm layer: reduction operators and collective names.
// Plain values; thread-safe to share.
// (ReduceOp and OpType are plain enums; the name functions return static strings.)
#pragma once

#include <cstdint>
#include <string>

namespace paratrain::comm {

// How allreduce / reduce / reduce_scatter combine values. kAvg divides the sum by the group
// size (integer division for integer types). bf16/f16 are combined in f32.
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

enum class OpType : uint8_t {
  kAllreduce, kReduceScatter, kAllgather, kBroadcast, kReduce, kAllToAll, kSend, kRecv, kBarrier
};

const char* reduce_op_name(ReduceOp op);
const char* op_type_name(OpType op);
// "sum" | "avg" | "max" | "min"; InputError otherwise.
ReduceOp parse_reduce_op(const std::string& s);

// nccl-tests' bus bytes of one call in a group of n ranks, from `call_bytes` = count x dtype
// size of the call as the ProcessGroup API counts it (per-rank buffer for allreduce, broadcast,
// reduce, send, recv; one rank's block for reduce_scatter, allgather, all_to_all):
//   allreduce                          call_bytes x 2(n-1)/n
//   reduce_scatter, allgather, a2a     call_bytes x (n-1)   (= total bytes x (n-1)/n)
//   broadcast, reduce, send, recv      call_bytes
//   barrier, or any collective of 1    0
// bus bytes / time = busbw, comparable across ops and group sizes (and with `bench comm`).
double bus_bytes(OpType op, uint64_t call_bytes, int n);

}  // namespace paratrain::comm
