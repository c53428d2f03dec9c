// Recursive-doubling all-reduce, for small messages (whole buffer fits one segment).
//
// With p = the largest power of two <= n, ranks r >= p first fold their buffer into rank
// r-p. The p remaining ranks then run log2(p) rounds: in round k rank r exchanges its whole
// buffer with r XOR 2^k and combines the two. Folded ranks finally get the result from r-p.
// Latency: log2(p) message exchanges (+2 when n is not a power of two) instead of the
// ring's 2(n-1); bytes: S per round, which is cheap when S is small. Combining a+b and b+a
// gives the same bits, so every rank ends with identical values, though not summed in rank
// order (the deterministic mode uses the rank-ordered algorithm instead).
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reduce_kernels.h"

namespace paratrain::comm::algorithms {

void allreduce_recursive_doubling(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1 || count == 0) return;
  const size_t bytes = count * dtype_size(dtype);
  PT_CHECK(bytes <= ctx.segment_bytes, "recursive doubling needs the message to fit one segment");
  int p = 1;
  while (p * 2 <= n) p *= 2;
  if (r >= p) {
    send_bytes(ctx, r - p, buf, bytes);
    recv_bytes(ctx, r - p, buf, bytes);
    return;
  }
  if (r + p < n) {
    const void* rx = recv_expect(ctx, r + p, bytes);
    kernels::reduce(buf, buf, rx, count, dtype, op);
    ctx.pair(r + p).recv_end();
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    int partner = r ^ mask;
    send_bytes(ctx, partner, buf, bytes);
    const void* rx = recv_expect(ctx, partner, bytes);
    // Lower rank's value first: a op b with a from the lower rank, the same on both sides.
    if (partner < r) kernels::reduce(buf, rx, buf, count, dtype, op);
    else kernels::reduce(buf, buf, rx, count, dtype, op);
    ctx.pair(partner).recv_end();
  }
  if (op == ReduceOp::kAvg) kernels::scale_avg(buf, count, dtype, n);
  if (r + p < n) send_bytes(ctx, r + p, buf, bytes);
}

}  // namespace paratrain::comm::algorithms
