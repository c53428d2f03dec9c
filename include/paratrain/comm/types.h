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

}  // namespace paratrain::comm
