// Pipelined chain broadcast.
//
// The ranks form a chain starting at the root: root, root+1, ..., root-1. The buffer is cut
// into segments; the root sends each segment to its successor, every middle rank copies a
// segment into its buffer and forwards it straight from its receive slot, the last rank
// only stores it. With s segments the broadcast takes n-1+s-1 segment steps, so for large
// buffers every rank receives and sends S once (bus bandwidth = link bandwidth); small
// buffers pay n-1 hops of latency.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace paratrain::comm::algorithms {

void broadcast_chain(const Context& ctx, void* buf, size_t count, DType dtype, int root) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dtype);
  char* data = static_cast<char*>(buf);
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (count + seg_elems - 1) / seg_elems;
  const int pos = ctx.mod(r - root);
  const int prev = ctx.mod(r - 1), next = ctx.mod(r + 1);
  for (size_t o = 0; o < rounds; ++o) {
    const size_t s0 = o * seg_elems, bytes = std::min(seg_elems, count - s0) * es;
    if (pos == 0) {
      send_bytes(ctx, next, data + s0 * es, bytes);
      continue;
    }
    const void* rx = recv_expect(ctx, prev, bytes);
    if (pos < n - 1) send_bytes(ctx, next, rx, bytes);
    std::memcpy(data + s0 * es, rx, bytes);
    ctx.pair(prev).recv_end();
  }
}

}  // namespace paratrain::comm::algorithms
