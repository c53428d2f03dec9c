// Direct all-to-all.
//
// Block p of rank r's input goes to rank p. Per segment round, rank r first sends its
// segment of block r+k to rank r+k for k = 1..n-1 (each to a different pair, so the sends
// never wait on each other), then receives the segment of block r from ranks r-1, r-2, ...
// Its own block is a local copy. Each rank sends and receives (n-1)/n of the buffer, in
// one step per segment.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace paratrain::comm::algorithms {

void all_to_all_direct(const Context& ctx, const void* input, void* output, size_t count, DType dtype) {
  const int n = ctx.size, r = ctx.rank;
  const size_t es = dtype_size(dtype);
  if (count == 0) return;
  const char* src = static_cast<const char*>(input);
  char* dst = static_cast<char*>(output);
  std::memmove(dst + size_t(r) * count * es, src + size_t(r) * count * es, count * es);
  if (n == 1) return;
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (count + seg_elems - 1) / seg_elems;
  for (size_t o = 0; o < rounds; ++o) {
    const size_t s0 = o * seg_elems, bytes = std::min(seg_elems, count - s0) * es;
    for (int k = 1; k < n; ++k) {
      int p = ctx.mod(r + k);
      send_bytes(ctx, p, src + (size_t(p) * count + s0) * es, bytes);
    }
    for (int k = 1; k < n; ++k) {
      int p = ctx.mod(r - k);
      recv_bytes(ctx, p, dst + (size_t(p) * count + s0) * es, bytes);
    }
  }
}

}  // namespace paratrain::comm::algorithms
