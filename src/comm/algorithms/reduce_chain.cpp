// Pipelined rank-ordered chain reduce.
//
// The chain is always 0 -> 1 -> ... -> n-1, whatever the root: rank 0 sends its segment,
// rank k combines the partial result x0..x(k-1) from its receive slot with its own x(k)
// straight into its send slot (so the sum is always taken in rank order, and the result is
// the same for any root), and rank n-1 finishes the segment; if the root is not n-1, rank
// n-1 sends the finished segment to the root. The root receives those with a lag of a few
// segments behind its own chain step so the pipeline never drains. Bytes: every rank sends
// at most S, plus S more from rank n-1 to the root. 16-bit types are rounded at each hop.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reduce_kernels.h"

namespace paratrain::comm::algorithms {

void reduce_chain(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op, int root) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dtype);
  char* data = static_cast<char*>(buf);
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (count + seg_elems - 1) / seg_elems;
  const int last = n - 1;
  const size_t kLag = 2;
  auto seg = [&](size_t o, size_t* s0, size_t* len) {
    *s0 = o * seg_elems;
    *len = std::min(seg_elems, count - *s0);
  };
  auto receive_final = [&](size_t o) {
    size_t s0, len;
    seg(o, &s0, &len);
    recv_bytes(ctx, last, data + s0 * es, len * es);
  };
  for (size_t o = 0; o < rounds; ++o) {
    size_t s0, len;
    seg(o, &s0, &len);
    char* mine = data + s0 * es;
    if (r == 0) {
      send_bytes(ctx, 1, mine, len * es);
    } else {
      const void* rx = recv_expect(ctx, r - 1, len * es);
      if (r < last) {
        Pair& out = ctx.pair(r + 1);
        void* tx = out.send_begin(ctx.deadline);
        kernels::reduce(tx, rx, mine, len, dtype, op);
        out.send_end(len * es);
      } else if (root == last) {
        kernels::reduce_avg(mine, rx, mine, len, dtype, op, n);
      } else {
        Pair& out = ctx.pair(root);
        void* tx = out.send_begin(ctx.deadline);
        kernels::reduce_avg(tx, rx, mine, len, dtype, op, n);
        out.send_end(len * es);
      }
      ctx.pair(r - 1).recv_end();
    }
    if (r == root && root != last && o >= kLag) receive_final(o - kLag);
  }
  if (r == root && root != last)
    for (size_t o = rounds >= kLag ? rounds - kLag : 0; o < rounds; ++o) receive_final(o);
}

}  // namespace paratrain::comm::algorithms
