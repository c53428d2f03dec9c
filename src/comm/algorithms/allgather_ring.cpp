// Ring all-gather.
//
// Rank r copies its input to block r of the output and sends it to r+1. In steps j =
// 1..n-1 it receives block r-j from r-1, stores it, and forwards it unless j = n-1. Blocks
// are cut into segments and every step of segment o runs before segment o+1, so several
// segments are in flight around the ring. Each rank sends and receives (n-1)/n of the
// gathered size in n-1 steps.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace paratrain::comm::algorithms {

void allgather_ring(const Context& ctx, const void* input, void* output, size_t count, DType dtype) {
  const int n = ctx.size, r = ctx.rank;
  const size_t es = dtype_size(dtype);
  char* dst = static_cast<char*>(output);
  if (count == 0) return;
  if (dst + size_t(r) * count * es != input) std::memmove(dst + size_t(r) * count * es, input, count * es);
  if (n == 1) return;
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (count + seg_elems - 1) / seg_elems;
  const int prev = ctx.mod(r - 1), next = ctx.mod(r + 1);
  for (size_t o = 0; o < rounds; ++o) {
    const size_t s0 = o * seg_elems, bytes = std::min(seg_elems, count - s0) * es;
    auto block = [&](int c) { return dst + (size_t(c) * count + s0) * es; };
    send_bytes(ctx, next, block(r), bytes);
    for (int j = 1; j <= n - 1; ++j) {
      const void* rx = recv_expect(ctx, prev, bytes);
      std::memcpy(block(ctx.mod(r - j)), rx, bytes);
      if (j < n - 1) send_bytes(ctx, next, rx, bytes);
      ctx.pair(prev).recv_end();
    }
  }
}

}  // namespace paratrain::comm::algorithms
