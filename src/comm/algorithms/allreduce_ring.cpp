// Ring all-reduce and ring reduce-scatter.
//
// The buffer is cut into n chunks (balanced, so sizes differ by at most one element) and
// each chunk into segments of at most segment_bytes. Ranks form the ring r -> r+1.
// Reduce-scatter, n-1 steps: at step 0 rank r sends its own chunk r; at step k it receives
// chunk (r-k) from r-1, adds its own contribution straight from the receive slot into the
// send slot, and passes it on. At step n-1 it receives chunk (r+1), which is then complete:
// it is written to the user buffer and (all-reduce) sent on as the first all-gather step.
// All-gather, n-1 more steps: receive a finished chunk, copy it into the user buffer and
// forward it, except at the last step. Rank r sends and receives 2(n-1)/n of the buffer.
//
// Segments rather than chunks are the unit of work: for segment index o we run every step
// of the ring before moving to o+1. Each pair's ring of slots holds several segments, so a
// rank is already sending segment o+1 while its successor reduces segment o: wire and
// reduction overlap, and no rank ever waits on a whole chunk. Message sizes are the same on
// both sides by construction (empty segments, when chunks differ in size, are sent as
// zero-byte messages to keep the lockstep).
//
// Reduce-scatter alone shifts the chunk schedule by one so that rank r finishes chunk r.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reduce_kernels.h"

namespace paratrain::comm::algorithms {

namespace {
struct Seg {
  size_t off, len;
};
}  // namespace

void allreduce_ring(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dtype);
  char* data = static_cast<char*>(buf);
  Blocks chunks{count, static_cast<size_t>(n)};
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (chunks.length(0) + seg_elems - 1) / seg_elems;
  const int prev = ctx.mod(r - 1), next = ctx.mod(r + 1);
  Pair& in = ctx.pair(prev);
  Pair& out = ctx.pair(next);
  for (size_t o = 0; o < rounds; ++o) {
    auto seg = [&](int c) {
      size_t cl = chunks.length(c);
      size_t s = std::min(o * seg_elems, cl), e = std::min(s + seg_elems, cl);
      return Seg{chunks.offset(c) + s, e - s};
    };
    // Reduce-scatter step 0: send our own chunk r.
    {
      Seg s = seg(r);
      void* slot = out.send_begin(ctx.deadline);
      std::memcpy(slot, data + s.off * es, s.len * es);
      out.send_end(s.len * es);
    }
    // Steps 1..n-2: receive, add ours, pass on.
    for (int k = 1; k <= n - 2; ++k) {
      Seg s = seg(ctx.mod(r - k));
      const void* rx = recv_expect(ctx, prev, s.len * es);
      void* tx = out.send_begin(ctx.deadline);
      kernels::reduce(tx, rx, data + s.off * es, s.len, dtype, op);
      out.send_end(s.len * es);
      in.recv_end();
    }
    // Step n-1: chunk r+1 is complete here; keep it and start the all-gather with it.
    {
      Seg s = seg(ctx.mod(r + 1));
      const void* rx = recv_expect(ctx, prev, s.len * es);
      kernels::reduce_avg(data + s.off * es, rx, data + s.off * es, s.len, dtype, op, n);
      in.recv_end();
      void* tx = out.send_begin(ctx.deadline);
      std::memcpy(tx, data + s.off * es, s.len * es);
      out.send_end(s.len * es);
    }
    // All-gather steps 1..n-1: chunk r+1-j arrives from r-1.
    for (int j = 1; j <= n - 1; ++j) {
      Seg s = seg(ctx.mod(r + 1 - j));
      const void* rx = recv_expect(ctx, prev, s.len * es);
      std::memcpy(data + s.off * es, rx, s.len * es);
      if (j < n - 1) {
        void* tx = out.send_begin(ctx.deadline);
        std::memcpy(tx, rx, s.len * es);
        out.send_end(s.len * es);
      }
      in.recv_end();
    }
  }
}

void reduce_scatter_ring(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                         ReduceOp op) {
  const int n = ctx.size, r = ctx.rank;
  const size_t es = dtype_size(dtype);
  if (count == 0) return;
  if (n == 1) {
    std::memcpy(output, input, count * es);
    return;
  }
  const char* src = static_cast<const char*>(input);
  char* dst = static_cast<char*>(output);
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (count + seg_elems - 1) / seg_elems;
  const int prev = ctx.mod(r - 1), next = ctx.mod(r + 1);
  Pair& in = ctx.pair(prev);
  Pair& out = ctx.pair(next);
  for (size_t o = 0; o < rounds; ++o) {
    const size_t s0 = o * seg_elems, len = std::min(seg_elems, count - s0), bytes = len * es;
    auto own = [&](int c) { return src + (size_t(c) * count + s0) * es; };
    // Step 0 sends chunk r-1; step k handles chunk r-1-k; rank r finishes chunk r.
    {
      void* tx = out.send_begin(ctx.deadline);
      std::memcpy(tx, own(ctx.mod(r - 1)), bytes);
      out.send_end(bytes);
    }
    for (int k = 1; k <= n - 2; ++k) {
      const void* rx = recv_expect(ctx, prev, bytes);
      void* tx = out.send_begin(ctx.deadline);
      kernels::reduce(tx, rx, own(ctx.mod(r - 1 - k)), len, dtype, op);
      out.send_end(bytes);
      in.recv_end();
    }
    const void* rx = recv_expect(ctx, prev, bytes);
    kernels::reduce_avg(dst + s0 * es, rx, own(r), len, dtype, op, n);
    in.recv_end();
  }
}

}  // namespace paratrain::comm::algorithms
