#include "paratrain/comm/types.h"

#include "paratrain/base/error.h"

namespace paratrain::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

const char* op_type_name(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kReduce: return "reduce";
    case OpType::kAllToAll: return "all_to_all";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kBarrier: return "barrier";
  }
  return "?";
}

double bus_bytes(OpType op, uint64_t call_bytes, int n) {
  const double b = static_cast<double>(call_bytes);
  switch (op) {
    case OpType::kSend:
    case OpType::kRecv: return b;
    case OpType::kBarrier: return 0;
    default: break;
  }
  if (n <= 1) return 0;
  switch (op) {
    case OpType::kAllreduce: return b * 2.0 * (n - 1) / n;
    case OpType::kReduceScatter:
    case OpType::kAllgather:
    case OpType::kAllToAll: return b * (n - 1);
    default: return b;  // broadcast, reduce
  }
}

ReduceOp parse_reduce_op(const std::string& s) {
  if (s == "sum") return ReduceOp::kSum;
  if (s == "avg" || s == "mean") return ReduceOp::kAvg;
  if (s == "max") return ReduceOp::kMax;
  if (s == "min") return ReduceOp::kMin;
  PT_THROW(InputError, "unknown reduce op '", s, "' (sum, avg, max, min)");
}

}  // namespace paratrain::comm
